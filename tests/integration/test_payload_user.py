"""`payload.user`: the payload runs as an unprivileged host user while the supervisor and its guard stay root
(as a batch system runs a job as its user). Its output and its result file are all it may write: a payload
that tries to rewrite its job's status.json gets EACCES and the job still ends right, with the service back.
On the confined systemd + sshd host (its non-root logins are real users of this machine).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from tests.cli_helpers import Target, run_cli, submit, wait_for, wait_terminal
from tests.harness.systemd_jobs import gpu_job

pytestmark = pytest.mark.systemd

# Tries every record of its job dir, then writes its result and exits 0.
ATTACKER = """
import json, os, time
job_dir = os.environ["RUNNER_JOB_DIR"]
print("uid", os.getuid(), "home", os.environ["HOME"], flush=True)
for name in ("status.json", "events.jsonl", "spec.json"):
    try:
        with open(os.path.join(job_dir, name), "w") as fh:
            fh.write(json.dumps({"state": "RUNNING", "started_at": 1, "service": {"stopped": False}}))
        print("wrote", name, flush=True)
    except OSError as exc:
        print("refused", name, exc.errno, flush=True)
try:
    open(os.path.join(job_dir, "new-file"), "w").close()
    print("created a file", flush=True)
except OSError as exc:
    print("refused new-file", exc.errno, flush=True)
with open(os.environ["RUNNER_RESULT"], "w") as fh:
    json.dump({"ran_as": os.getuid()}, fh)
print("ended", time.time(), flush=True)
"""


def user_target(host, work) -> Target:
    """host.root where the payload's user can reach its job dir (root's own home is 0700)."""
    root = work / "root"
    return Target("ssh", {"address": host.alias, "root": str(root)}, root,
                  {"RUNNER_SSH_CONFIG": str(host.ssh_config)}, host)


def user_job(work, host, user: str):
    script = work / "attacker.py"
    script.write_text(ATTACKER)
    target = user_target(host, work)
    path = gpu_job(work, host, stop="always", command=["python3", str(script)], target=target)
    spec = yaml.safe_load(path.read_text())
    spec["payload"]["user"] = user
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return target, path


def test_a_payload_running_as_its_user_cannot_rewrite_its_records(service_host, work):
    user = service_host.nosudo_user
    target, path = user_job(work, service_host, user)
    done = run_cli(target, "submit", str(path), "--json")
    assert done.returncode == 0, done.stderr.decode()
    job_id = json.loads(done.stdout)["job_id"]
    log = f"{target.root}/jobs/{job_id}/output.log"
    wait_for(lambda: "ended" in service_host.ssh(["cat", log]).stdout, timeout=60, what="payload ended")
    wait_for(lambda: service_host.service_state() == "active" and service_host.health_status() == 200, timeout=60,
             what="service back")
    ended = float(service_host.ssh(["cat", log]).stdout.split("ended")[-1].split()[0])
    print("\nHOSTILE-INPUT payload.user, the payload rewrites its records: EACCES; serving %.1f s after its end"
          % (time.time() - ended))
    job = wait_terminal(target, job_id, timeout=120)
    output = service_host.ssh(["cat", log]).stdout
    uid = service_host.ssh(["id", "-u", user]).stdout.strip()
    assert f"uid {uid} " in output, output
    for name in ("status.json", "events.jsonl", "spec.json", "new-file"):
        assert f"refused {name} 13" in output, output  # EACCES
    assert job["state"] == "SUCCEEDED" and job["restored"] is True and job["service"]["healthy"] is True, job
    assert service_host.service_state() == "active" and service_host.health_status() == 200
    result = service_host.ssh(["cat", f"{target.root}/jobs/{job_id}/result.json"]).stdout
    assert json.loads(result) == {"ran_as": int(uid)}


def test_an_unknown_payload_user_is_refused_before_anything_is_touched(service_host, work):
    target, path = user_job(work, service_host, "no-such-user-q7")
    done = run_cli(target, "submit", str(path), "--json")
    assert done.returncode == 4, (done.returncode, done.stdout, done.stderr)
    assert b"payload.user" in done.stdout + done.stderr
    assert service_host.service_state() == "active"


def test_payload_user_is_refused_when_root_is_out_of_the_users_reach(service_host, work):
    """The default ROOT under root's 0700 home: the user could not reach its result file."""
    target, path = user_job(work, service_host, service_host.nosudo_user)
    spec = yaml.safe_load(path.read_text())
    spec["host"].pop("root")
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = run_cli(target, "submit", str(path), "--json")
    assert done.returncode == 4, (done.returncode, done.stdout, done.stderr)
    assert b"not searchable" in done.stdout + done.stderr


def test_payload_user_is_refused_when_the_supervisor_is_not_root(service_host, work):
    """Only root can run the payload as another user: a supervisor logged in as a sudo user is refused."""
    login = service_host.as_user(service_host.sudo_user)
    target = Target("ssh", {"address": login.alias}, Path("/unused"),
                    {"RUNNER_SSH_CONFIG": str(service_host.ssh_config)}, login)
    script = work / "attacker.py"
    script.write_text(ATTACKER)
    path = gpu_job(work, service_host, stop="always", command=["python3", str(script)], target=target, sudo=True)
    spec = yaml.safe_load(path.read_text())
    spec["payload"]["user"] = service_host.nosudo_user
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = run_cli(target, "submit", str(path), "--json")
    assert done.returncode == 4, (done.returncode, done.stdout, done.stderr)
    assert b"only root can run the payload" in done.stdout + done.stderr
    assert service_host.service_state() == "active"


def test_a_sweep_as_its_user_keeps_each_variants_result(service_host, work):
    """Each variant's result file is made for the user in turn; the combined result holds both."""
    target, path = user_job(work, service_host, service_host.nosudo_user)
    spec = yaml.safe_load(path.read_text())
    spec["payload"]["command"] = ["sh", "-c", 'echo "{\\"n\\": {n}, \\"uid\\": $(id -u)}" > "$RUNNER_RESULT"']
    spec["sweep"] = {"matrix": {"n": [1, 2]}}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = run_cli(target, "submit", str(path), "--json")
    assert done.returncode == 0, done.stderr.decode()
    job = wait_terminal(target, json.loads(done.stdout)["job_id"], timeout=120)
    assert job["state"] == "SUCCEEDED" and job["restored"] is True, job
    result = json.loads(service_host.ssh(["cat", f"{target.root}/jobs/{job['job_id']}/result.json"]).stdout)
    uid = int(service_host.ssh(["id", "-u", service_host.nosudo_user]).stdout)
    assert [v["result"] for v in result["variants"]] == [{"n": 1, "uid": uid}, {"n": 2, "uid": uid}], result


# ── a script payload as its user: it runs, nothing of the user's runs as root, other logins read nothing ───

BENCH = """
import json, os
print("token", os.environ.get("HF_TOKEN"), flush=True)
with open(os.environ["RUNNER_RESULT"], "w") as fh:
    json.dump({"ran_as": os.getuid()}, fh)
"""

# Whatever python starts with it on PYTHONPATH writes its uid to MARK/<pid>: the user's code, where it ran.
SITECUSTOMIZE = """
import os
if os.environ.get("MARK"):
    with open(os.path.join(os.environ["MARK"], str(os.getpid())), "w") as fh:
        fh.write(str(os.getuid()))
"""


def user_script_job(work, host, user: str, env: dict | None = None):
    (work / "bench.py").write_text(BENCH)
    target = user_target(host, work)
    path = gpu_job(work, host, stop="always", target=target)
    spec = yaml.safe_load(path.read_text())
    spec["payload"] = {"script": "bench.py", "python": "python3", "user": user, "env": env or {}}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return target, path


def test_a_script_payload_runs_as_its_user(service_host, work):
    """The uploaded bundle is root's: before, the script could not be read by its user (Errno 13) though the
    preflight passed (it ran as root), and a job that stopped the service stopped it for nothing."""
    user = service_host.nosudo_user
    target, path = user_script_job(work, service_host, user)
    job = wait_terminal(target, submit(target, path), timeout=120)
    uid = int(service_host.ssh(["id", "-u", user]).stdout)
    assert job["state"] == "SUCCEEDED" and job["restored"] is True, job
    result = service_host.ssh(["cat", f"{target.root}/jobs/{job['job_id']}/result.json"]).stdout
    assert json.loads(result) == {"ran_as": uid}


def test_nothing_the_payload_user_can_change_runs_as_root_at_preflight(service_host, work):
    """payload.env's PYTHONPATH names a folder of the user's with a sitecustomize.py: the preflight's probe of
    payload.python (even `submit --dry-run`) ran it as uid 0. It runs as the user, or not at all."""
    user = service_host.nosudo_user
    lib, marks = work / "userlib", work / "marks"
    lib.mkdir()
    (lib / "sitecustomize.py").write_text(SITECUSTOMIZE)
    marks.mkdir()
    marks.chmod(0o1777)
    service_host.ssh(["chown", "-R", user, str(lib)], check=True)
    target, path = user_script_job(work, service_host, user, env={"PYTHONPATH": str(lib), "MARK": str(marks)})
    done = run_cli(target, "submit", str(path), "--dry-run", "--json")
    ran = {mark.read_text() for mark in marks.iterdir()}
    uid = service_host.ssh(["id", "-u", user]).stdout.strip()
    assert "0" not in ran, "the user's sitecustomize.py ran as root: %s (%s)" % (ran, done.stdout.decode()[-500:])
    assert done.returncode == 0 and ran == {uid}, (done.returncode, ran, done.stdout, done.stderr)


def test_another_login_reads_nothing_of_a_payload_user_job(service_host, work):
    """A second login of the host (here the sudo login) read the first team's payload.env (spec.json 0644 in a
    job dir 0711 under ROOT/jobs 0755), its output and its result. Now: none of it, nor the list of jobs."""
    secret = "hf_secret_7c1d"
    target, path = user_script_job(work, service_host, service_host.nosudo_user, env={"HF_TOKEN": secret})
    spec = yaml.safe_load(path.read_text())
    spec["payload"] = dict(spec["payload"], command=["python3", str(work / "bench.py")], script=None)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    job = wait_terminal(target, submit(target, path), timeout=120)
    assert job["state"] == "SUCCEEDED", job
    other = service_host.as_user(service_host.sudo_user)
    job_dir = f"{target.root}/jobs/{job['job_id']}"
    for name in ("spec.json", "status.json", "events.jsonl", "output.log", "result.json", "restore.log"):
        done = other.ssh(["cat", f"{job_dir}/{name}"])
        assert done.returncode != 0 and secret not in done.stdout and not done.stdout, (name, done.stdout)
    assert job["job_id"] not in other.ssh(["ls", f"{target.root}/jobs"]).stdout
    assert secret in service_host.ssh(["cat", f"{job_dir}/output.log"]).stdout  # root's own view is whole
