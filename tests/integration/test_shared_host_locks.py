"""One owner per unit and per GPU on a shared host, whatever the login and its host.root; and no other local
user can hold runner's own lock file. On the confined systemd + sshd host: root's login (its own ROOT) and the
sudo login (its own ~/.runner, `service.sudo: true`) stand for two people sharing the box; the host's nosudo
login stands for any other local user.
"""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.cli_helpers import Target, run_cli, submit, wait_for, wait_terminal
from tests.harness.systemd_jobs import HANG, gpu_job, target_for

pytestmark = pytest.mark.systemd


def sudo_login_target(host) -> Target:
    login = host.as_user(host.sudo_user)
    return Target("ssh", {"address": login.alias}, host.workdir / "home" / host.sudo_user / ".runner",
                  {"RUNNER_SSH_CONFIG": str(host.ssh_config)}, login)


def shared_root_target(host, work) -> Target:
    """Root's login with a host.root any local user can reach (as payload.user setups have it)."""
    root = work / "root"
    return Target("ssh", {"address": host.alias, "root": str(root)}, root,
                  {"RUNNER_SSH_CONFIG": str(host.ssh_config)}, host)


def hold_the_unit_stopped(work, host, target, **extra):
    """A job of `target`'s login that stops the unit and runs until cancelled; its id once the unit is down."""
    job_id = submit(target, gpu_job(work / "a", host, stop="always", command=HANG, target=target, **extra))
    wait_for(lambda: host.service_state() != "active" and "hanging" in host.ssh(
        ["sh", "-c", f"cat {target.root}/jobs/{job_id}/output.log 2>/dev/null; true"]).stdout,
        timeout=60, what="the first job running with the unit stopped")
    return job_id


def end(target, job_id) -> dict:
    run_cli(target, "cancel", job_id)
    return wait_terminal(target, job_id, timeout=120)


@pytest.mark.parametrize("first", ["root", "sudo"])
def test_a_second_login_is_refused_while_the_first_holds_the_unit_stopped(service_host, work, first):
    """Login A's job stops the unit; login B (its own host.root) submits: exit 5 naming A's job, nothing of B's
    runs, and A's end brings the unit back (before: B was told "was inactive" and ran its window inside A's)."""
    (work / "a").mkdir()
    (work / "b").mkdir()
    logins = {"root": (target_for(service_host), {}), "sudo": (sudo_login_target(service_host), {"sudo": True})}
    (a, a_extra), (b, b_extra) = logins[first], logins["sudo" if first == "root" else "root"]
    job_a = hold_the_unit_stopped(work, service_host, a, **a_extra)
    try:
        done = run_cli(b, "submit", str(gpu_job(work / "b", service_host, stop="if-needed", command=["true"],
                                                  target=b, **b_extra)), "--json")
        said = (done.stdout + done.stderr).decode()
        assert done.returncode == 5, (done.returncode, said)
        assert job_a in said, said
    finally:
        job = end(a, job_a)
    assert job["state"] == "CANCELLED" and job["restored"] is True, job
    assert service_host.service_state() == "active" and service_host.health_status() == 200


# Run as another local user (the host's nosudo login): open the lock file read-only and flock it, the attack of
# a user who wants every job refused. argv[1]: the lock files to try, ':'-separated (the first that exists).
LOCK_HOLDER = """
import fcntl, os, sys, time
paths = [p for p in sys.argv[1].split(":") if os.path.exists(p)]
print("pid", os.getpid(), flush=True)
try:
    fd = os.open(paths[0], os.O_RDONLY)
except (OSError, IndexError) as exc:
    print("refused", getattr(exc, "errno", "missing"), flush=True)
    sys.exit(0)
fcntl.flock(fd, fcntl.LOCK_SH)
print("held", flush=True)
time.sleep(600)
"""


def as_other_user(host, work, argv: list) -> subprocess.Popen:
    script = work / "other_user.py"
    script.write_text(LOCK_HOLDER)
    login = host.as_user(host.nosudo_user)
    return subprocess.Popen(["ssh", "-F", str(host.ssh_config), login.alias, "--", "python3", str(script), *argv],
                            stdout=subprocess.PIPE, text=True)


def test_another_local_user_cannot_hold_runners_lock_file(service_host, work):
    """A local user opens the lock file of a running job read-only and waits on its flock, to hold it once the
    job lets go (before: every later submit exit 5 "held by an unknown process" for as long as it liked). The
    file is the taker's alone (0600): the open is refused and the next job runs."""
    (work / "a").mkdir()
    target = shared_root_target(service_host, work)
    job_a = hold_the_unit_stopped(work, service_host, target)
    candidates = f"{target.root}/locks/gpu-0.lock:/run/lock/runner-gpu-0.lock"
    other = as_other_user(service_host, work, [candidates])
    pid = other.stdout.readline().split()[-1]
    try:
        time.sleep(1)  # its open is done (refused), or it waits on the flock
        end(target, job_a)
        said = other.stdout.readline().strip()  # "refused …", or "held" once the job let go
        job_b = run_cli(target, "submit", str(gpu_job(work, service_host, stop="if-needed", command=["true"],
                                                         target=target)), "--json")
        assert job_b.returncode == 0, (said, job_b.returncode, job_b.stdout, job_b.stderr)
        job = wait_terminal(target, json.loads(job_b.stdout)["job_id"], timeout=120)
        assert job["state"] == "SUCCEEDED", job
        assert said.startswith("refused"), said
    finally:
        service_host.ssh(["kill", "-KILL", pid])
        other.kill()


SQUATTER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("pid", os.getpid(), flush=True)
time.sleep(600)
"""


def test_a_lock_name_another_user_holds_is_refused_naming_that_user(service_host, work):
    """What a local user can still do: make the lock's name before any job does, and hold it. The refusal names
    that user and process (never "an unknown process"); the service is untouched."""
    script = work / "squatter.py"
    script.write_text(SQUATTER)
    login = service_host.as_user(service_host.nosudo_user)
    squatter = subprocess.Popen(["ssh", "-F", str(service_host.ssh_config), login.alias, "--", "python3", str(script),
                                 "/run/lock/runner-gpu-0.lock"], stdout=subprocess.PIPE, text=True)
    pid = squatter.stdout.readline().split()[-1]
    try:
        target = target_for(service_host)
        done = run_cli(target, "submit", str(gpu_job(work, service_host, stop="always", command=["true"])), "--json")
        said = (done.stdout + done.stderr).decode()
        assert done.returncode == 5, (done.returncode, said)
        assert service_host.nosudo_user in said and f"pid {pid}" in said, said
        assert service_host.service_state() == "active"
    finally:
        service_host.ssh(["kill", "-KILL", pid])
        squatter.kill()


def test_a_stop_another_login_still_owes_is_busy_until_its_unit_runs_again(service_host, work):
    """What a dead job of the sudo login leaves: its ledger entry (its file) and the unit stopped. Root's submit
    is refused naming that job (its restorers bring the unit back, not a window of root's); once the unit runs
    again the entry owes nothing a window could break, and root's job runs (the entry stays the sudo login's)."""
    login = service_host.as_user(service_host.sudo_user)
    entry = {"unit": service_host.unit, "job_id": "their-job", "root": "/home/them/.runner", "was": "active",
             "stopped_at": time.time()}
    path = f"/run/lock/runner-ledger-service-{service_host.unit}.json"
    login.ssh(["python3", "-c", "import sys; open(sys.argv[1], 'w').write(sys.argv[2])", path, json.dumps(entry)],
              check=True)
    login.ssh(["sudo", "-n", "systemctl", "stop", service_host.unit], check=True)
    target = target_for(service_host)
    job_file = gpu_job(work, service_host, stop="if-needed", command=["true"])
    done = run_cli(target, "submit", str(job_file), "--json")
    said = (done.stdout + done.stderr).decode()
    assert done.returncode == 5 and "their-job" in said and service_host.sudo_user in said, (done.returncode, said)
    assert service_host.service_state() == "inactive"
    service_host.systemctl("start", service_host.unit).check_returncode()
    wait_for(lambda: service_host.health_status() == 200, timeout=60, what="the unit serving again")
    job = wait_terminal(target, submit(target, job_file), timeout=120)
    assert job["state"] == "SUCCEEDED", job
    assert service_host.ssh(["stat", "-c", "%U", path]).stdout.strip() == service_host.sudo_user


def test_a_guard_that_restored_leaves_no_lock_file_in_another_logins_way(service_host, fork_path, work):
    """The fork path: the supervisor is SIGKILLed, its guard restores with the supervisor's lock fds and, as any
    holder letting go, removes their names; a lock file of root's left behind would be "left by root" to the
    sudo login, which cannot take or replace it."""
    (work / "a").mkdir()
    (work / "b").mkdir()
    root_login = target_for(service_host)
    job_id = hold_the_unit_stopped(work, service_host, root_login)
    status = json.loads(service_host.ssh(["cat", f"/root/.runner/jobs/{job_id}/status.json"]).stdout)
    service_host.ssh(["kill", "-KILL", str(status["supervisor"]["pid"])], check=True)
    job = wait_terminal(root_login, job_id, timeout=120)
    assert job["restored"] is True and "guard restored" in job["message"], job
    wait_for(lambda: "runner-" not in service_host.ssh(["sh", "-c", "ls /run/lock/*.lock; true"]).stdout,
             timeout=30, what="the guard's lock files gone")
    sudo_login = sudo_login_target(service_host)
    later = submit(sudo_login, gpu_job(work / "b", service_host, stop="always", command=["true"], target=sudo_login,
                                       sudo=True))
    assert wait_terminal(sudo_login, later, timeout=120)["state"] == "SUCCEEDED"
