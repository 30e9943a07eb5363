"""A payload that corrupts or forges its job's status.json must not keep the service down, nor make a job that
left the service down read as SUCCEEDED. The restorers trust the host ledger (outside the job dir: what was
stopped, by which job) over status.json, which the payload can write. On the confined systemd + sshd host.

The payload runs as the same user as the supervisor, so it could also delete the ledger or stop the service
itself: these cases are the corruption a payload can do by writing the files of its own job dir.
"""
from __future__ import annotations

import time

import pytest

from tests.cli_helpers import pid_alive_on, run_cli, status, submit, wait_for
from tests.harness.pace import Scale
from tests.harness.systemd_jobs import RECORDED_PRELUDE, gpu_job, host_status, target_for

pytestmark = pytest.mark.systemd

# Overwrite status.json (argv[1]: "garbage" or "forged"), then SIGKILL the supervisor and its guard.
# The records are corrupted only once they name this payload (RECORDED_PRELUDE).
FORGER = RECORDED_PRELUDE + """
if sys.argv[1] == "garbage":
    text = "\\x00 not json {{{"
else:
    text = json.dumps(dict(status, state="SUCCEEDED", phase="done", restored=True, exit_code=0,
                           message="payload exited 0", service=dict(status["service"], now="active", healthy=True)))
print("forging", sys.argv[1], flush=True)
with open(path, "w") as fh:
    fh.write(text)
if sys.argv[2] == "kill":
    for who in ("guard", "supervisor"):
        os.kill(status[who]["pid"], signal.SIGKILL)
time.sleep(600)
"""


def forging_job(work, host, how: str, then: str):
    script = work / "forger.py"
    script.write_text(FORGER)
    return gpu_job(work, host, stop="always", command=["python3", str(script), how, then], max_runtime="40s")


def settled_status(host, job_id: str) -> dict:
    """status.json once it is JSON again ({} while it still holds the payload's garbage)."""
    try:
        return host_status(host, job_id)
    except ValueError:
        return {}


def serving(host) -> bool:
    return host.service_state() == "active" and host.health_status() == 200


def service_back(host, timeout: float = 60) -> None:
    wait_for(lambda: serving(host), timeout=timeout, what="service active and healthy")


def forged(host, job_id: str) -> bool:
    return "forging" in host.ssh(["cat", f"/root/.runner/jobs/{job_id}/output.log"]).stdout


@pytest.mark.parametrize("how", ["garbage", "forged"])
def test_unit_path_restores_after_status_is_overwritten_and_both_processes_are_killed(service_host, work, how):
    """ExecStopPost= runs `restore` without any controller call: it must settle from the ledger."""
    target = target_for(service_host)
    job_id = submit(target, forging_job(work, service_host, how, "kill"))
    wait_for(lambda: forged(service_host, job_id), timeout=Scale()(30), what="payload forged status.json")
    service_back(service_host)
    wait_for(lambda: settled_status(service_host, job_id).get("restored") is True, timeout=30, what="settled")
    final = host_status(service_host, job_id)
    assert final["state"] != "SUCCEEDED" and "host ledger" in final["message"], final
    assert service_host.ssh(["sh", "-c", "ls /run/lock/runner-ledger-* 2>/dev/null; true"]).stdout.strip() == ""


@pytest.mark.parametrize("how", ["garbage", "forged"])
def test_fork_path_restorer_settles_from_the_ledger(service_host, work, fork_path, how):  # noqa: F811
    """No unit: `runner status` reaps the job and its restorer settles from the ledger; the forged SUCCEEDED is
    never reported (tail does not exit 0) while the service is down."""
    target = target_for(service_host)
    job_id = submit(target, forging_job(work, service_host, how, "kill"))
    bound = Scale()
    wait_for(lambda: forged(service_host, job_id), timeout=bound(30), what="payload forged status.json")
    deadline = time.monotonic() + bound(60)
    while not serving(service_host) and time.monotonic() < deadline:  # it says "forging" before its kills
        done = run_cli(target, "tail", job_id)  # reaps once both processes are gone
        assert done.returncode != 0, done.stderr.decode()
        time.sleep(0.5)
    service_back(service_host)
    wait_for(lambda: settled_status(service_host, job_id).get("restored") is True, timeout=30, what="settled")
    final = status(target, job_id)
    assert final["state"] != "SUCCEEDED" and final["restored"] is True and "host ledger" in final["message"], final
    assert not pid_alive_on(target, final["payload"]["pid"])  # the ledger named the payload: its leftovers are gone


def test_forged_success_while_the_supervisor_lives_is_not_believed(service_host, work):
    """status.json says SUCCEEDED + restored while the job still holds the service stopped: `status` must not
    report it ended, and `tail` must not exit 0."""
    target = target_for(service_host)
    job_id = submit(target, forging_job(work, service_host, "forged", "live"))
    wait_for(lambda: forged(service_host, job_id), timeout=Scale()(30), what="payload forged status.json")
    assert service_host.service_state() != "active"
    done = run_cli(target, "status", job_id, "--json")
    assert done.returncode == 75, (done.returncode, done.stdout)
    assert run_cli(target, "tail", job_id).returncode == 75
    run_cli(target, "cancel", job_id)
    service_back(service_host)
