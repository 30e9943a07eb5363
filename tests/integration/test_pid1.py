"""PID 1 as the last line: where the host has systemd, the supervisor runs in a transient unit
(remote_payload/supervision/unit.py) whose ExecStopPost= restores, whose watchdog and RuntimeMaxSec= overrule a
hung supervisor, and whose cgroup holds every process of the job. On the real confined systemd + sshd host.

After the kill or stop below, the tests read status.json over plain ssh only: no controller call (a `runner
status` would reap the job and start a restore itself).
"""
from __future__ import annotations

import pytest

from tests.cli_helpers import run_cli, status, submit, wait_for, wait_terminal
from tests.harness.systemd_jobs import (HANG, assert_service_back, gpu_job, host_output, host_status, restored_within,
                                        target_for)

pytestmark = pytest.mark.systemd

# The payload forks a child that calls setsid and forks again: the grandchild is in no process group of ours.
ESCAPER = ["python3", "-c", """
import os, sys, time
pidfile = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(pidfile + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.rename(pidfile + ".tmp", pidfile)
        time.sleep(600)
    os._exit(0)
print("escaped", flush=True)
time.sleep(600)
"""]


def running(host, target, job_id: str) -> dict:
    wait_for(lambda: status(target, job_id)["state"] == "RUNNING", what="running")
    return status(target, job_id)


def test_supervisor_and_guard_sigkilled_systemd_restores_without_a_controller_call(service_host, work):
    """Both of our processes SIGKILLed while the service is stopped: the unit's ExecStopPost= restores."""
    target = target_for(service_host)
    job_id = submit(target, gpu_job(work, service_host, stop="always", command=HANG))
    job = running(service_host, target, job_id)
    assert service_host.service_state() != "active"
    service_host.ssh(["kill", "-KILL", str(job["supervisor"]["pid"]), str(job["guard"]["pid"])], check=True)
    seconds = restored_within(service_host, job_id, timeout=90)
    job = host_status(service_host, job_id)
    assert_service_back(service_host, job, f"supervisor+guard SIGKILLed: systemd's ExecStopPost restores, no controller "
                        f"call ({seconds:.0f} s)", job["state"])
    assert job["launch"]["mode"] == "systemd-unit", job.get("launch")
    assert "ExecStopPost" in job["message"], job["message"]


def test_a_double_forked_setsid_payload_is_gone_after_cancel(service_host, work):
    """The payload's grandchild leaves the payload's process group; cancel must still end it (the unit's cgroup)."""
    target = target_for(service_host)
    pidfile = work / "grandchild.pid"
    job_id = submit(target, gpu_job(work, service_host, stop="always", command=ESCAPER + [str(pidfile)]))
    running(service_host, target, job_id)
    wait_for(pidfile.exists, what="grandchild pid")
    grandchild = pidfile.read_text().strip()
    alive = lambda: service_host.ssh(["kill", "-0", grandchild]).returncode == 0  # noqa: E731
    try:
        assert alive()
        done = run_cli(target, "cancel", job_id)
        assert done.returncode == 0, done.stderr.decode()
        job = wait_terminal(target, job_id)
        assert_service_back(service_host, job, "payload double-forks + setsid, then cancel: the grandchild is gone",
                            "CANCELLED")
        wait_for(lambda: not alive(), timeout=30, what=f"grandchild {grandchild} gone after cancel")
    finally:
        service_host.ssh(["kill", "-KILL", grandchild])


@pytest.mark.slow(seconds=40)
def test_supervisor_and_guard_sigstopped_are_overruled_by_the_unit_watchdog(service_host, work):
    """The whole job hung (supervisor and guard SIGSTOPped for good) with the service stopped: systemd
    (the unit's watchdog, then its ExecStopPost=) restores within the watchdog + the restore budget."""
    target = target_for(service_host)
    job_id = submit(target, gpu_job(work, service_host, stop="always", command=HANG))
    job = running(service_host, target, job_id)
    pids = [str(job["supervisor"]["pid"]), str(job["guard"]["pid"])]
    service_host.ssh(["kill", "-STOP", *pids], check=True)
    try:
        seconds = restored_within(service_host, job_id, timeout=120)
    finally:
        service_host.ssh(["kill", "-KILL", *pids])
    job = host_status(service_host, job_id)
    assert_service_back(service_host, job, f"supervisor+guard SIGSTOPped (hung): the unit's watchdog overrules them "
                        f"({seconds:.0f} s)", job["state"])
    assert "hanging" in host_output(service_host, job_id)
    assert "watchdog" in job["message"], job["message"]
