"""Service and GPU choreography with the restore guarantee, on a real (confined) systemd over real sshd.

The host runs `dummy-infer.service`: a real HTTP server that answers /health after a start delay and
"holds" GPU memory (read by the nvidia-smi stand-in) while it runs. Every case asserts the service's
final state and that status.json tells the truth; each records a row for docs/reliability.md.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.case_report import record
from tests.cli_helpers import run_cli, status, submit, wait_for, wait_terminal
from tests.harness.systemd_jobs import (HANG, HOLD, SMALL_GPU, assert_service_back, gpu_job, host_status, main_pid,
                                        target_for)

pytestmark = pytest.mark.systemd


def test_if_needed_with_enough_memory_leaves_service_untouched(service_host, work):
    before = main_pid(service_host)
    job_id = submit(target_for(service_host), gpu_job(work, service_host, need=8000))
    job = wait_terminal(target_for(service_host), job_id)
    assert_service_back(service_host, job, "if-needed, memory enough", "SUCCEEDED")
    assert job["service"]["stopped"] is False and main_pid(service_host) == before


def test_if_needed_with_too_little_memory_stops_drains_runs_restores(service_host, work):
    service_host.set_gpu(total_mib=SMALL_GPU, baseline_used=10000)  # free 5904 while the unit runs
    before = main_pid(service_host)
    job_id = submit(target_for(service_host), gpu_job(work, service_host, need=8000))
    job = wait_terminal(target_for(service_host), job_id)
    assert_service_back(service_host, job, "if-needed, memory short: stop, drain, run, restore", "SUCCEEDED")
    assert job["service"]["stopped"] is True and job["service"]["downtime_s"] > 0
    assert main_pid(service_host) != before  # it really was stopped and started again
    events = [json.loads(line) for line in service_host.ssh(["cat", f"/root/.runner/jobs/{job_id}/events.jsonl"]).stdout.splitlines()]
    states = [e.get("state") for e in events if e.get("state")]
    assert states.index("STOPPING_SERVICE") < states.index("DRAINING") < states.index("RUNNING") < states.index("RESTORING")


def test_never_with_too_little_memory_refused_and_untouched(service_host, work):
    service_host.set_gpu(total_mib=SMALL_GPU, baseline_used=10000)
    before = main_pid(service_host)
    done = run_cli(target_for(service_host), "submit", str(gpu_job(work, service_host, stop="never", need=8000)))
    now, health = service_host.service_state(), service_host.health_status()
    record("never, memory short: refused (exit 4)", {"state": f"exit {done.returncode}", "service": {"was": "active"}},
           expected="exit 4", service_now=now, healthy=health == 200, note=done.stderr.decode().strip().splitlines()[0])
    assert done.returncode == 4, done.stderr.decode()
    assert b"never" in done.stderr and b"MiB" in done.stderr
    assert now == "active" and main_pid(service_host) == before


def test_need_above_total_refused_at_once(service_host, work):
    done = run_cli(target_for(service_host), "submit", str(gpu_job(work, service_host, need=500000)))
    assert done.returncode == 4 and b"in total" in done.stderr
    assert service_host.service_state() == "active"


def hold_on_host(host, mib: int, seconds: int) -> int:
    done = host.ssh(["sh", "-c", f"nohup python3 {HOLD} {mib} {seconds} >/dev/null 2>&1 </dev/null & echo $!"], check=True)
    return int(done.stdout.strip())


def test_drain_timeout_restores_and_names_the_holder(service_host, work):
    service_host.set_gpu(total_mib=SMALL_GPU, baseline_used=0)
    holder = hold_on_host(service_host, 12000, 120)  # a stray process that never lets go
    try:
        wait_for(lambda: service_host.gpu_used_mib() >= 16000, what="holder visible")
        job_id = submit(target_for(service_host), gpu_job(work, service_host, need=9000, drain="3s"))
        job = wait_terminal(target_for(service_host), job_id)
    finally:
        service_host.ssh(["kill", str(holder)])
    assert_service_back(service_host, job, "drain timeout: holder named, service restored", "FAILED")
    assert str(holder) in job["message"], job["message"]


CRASH = ["python3", "-c", "raise RuntimeError('payload crashed on purpose')"]


def test_payload_crash_restores(service_host, work):
    job_id = submit(target_for(service_host), gpu_job(work, service_host, stop="always", command=CRASH))
    job = wait_terminal(target_for(service_host), job_id)
    assert_service_back(service_host, job, "payload crash", "FAILED")
    assert job["exit_code"] == 1 and job["service"]["stopped"] is True


def test_payload_hang_past_max_runtime_restores(service_host, work):
    job_id = submit(target_for(service_host), gpu_job(work, service_host, stop="always", command=HANG,
                                                     max_runtime="3s", grace="1s"))
    job = wait_terminal(target_for(service_host), job_id)
    assert_service_back(service_host, job, "payload hang past max_runtime", "TIMED_OUT")


def test_cancel_restores(service_host, work):
    target = target_for(service_host)
    job_id = submit(target, gpu_job(work, service_host, stop="always", command=HANG))
    wait_for(lambda: status(target, job_id)["state"] == "RUNNING", what="running")
    assert run_cli(target, "cancel", job_id).returncode == 0
    job = wait_terminal(target, job_id)
    assert_service_back(service_host, job, "cancel", "CANCELLED")


def test_controller_killed_right_after_submit(service_host, work):
    target = target_for(service_host)
    job_file = gpu_job(work, service_host, stop="always", command=["python3", HOLD, "1000", "3"])
    controller = subprocess.Popen([sys.executable, "-m", "runner", "submit", str(job_file), "--job-id", "orphan-1"],
                                  env={**os.environ, **target.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    controller.communicate(timeout=60)
    # The controller is gone for good; no one ever calls status or tail. Watch the host's own record.
    wait_for(lambda: host_status(service_host, "orphan-1").get("state") == "SUCCEEDED", timeout=60, what="job finished")
    job = host_status(service_host, "orphan-1")
    assert_service_back(service_host, job, "controller gone after submit", "SUCCEEDED")


def signal_supervisor(host, target, job_id: str, sig: signal.Signals) -> None:
    wait_for(lambda: status(target, job_id)["state"] == "RUNNING", what="running")
    pid = status(target, job_id)["supervisor"]["pid"]
    host.ssh(["kill", f"-{sig.name[3:]}", str(pid)], check=True)


def test_supervisor_sigterm_restores(service_host, work):
    target = target_for(service_host)
    job_id = submit(target, gpu_job(work, service_host, stop="always", command=HANG))
    signal_supervisor(service_host, target, job_id, signal.SIGTERM)
    job = wait_terminal(target, job_id)
    assert_service_back(service_host, job, "supervisor SIGTERM", "FAILED")
    assert "SIGTERM" in job["message"]


def test_supervisor_sigkill_guard_restores(service_host, work):
    target = target_for(service_host)
    job_id = submit(target, gpu_job(work, service_host, stop="always", command=HANG))
    signal_supervisor(service_host, target, job_id, signal.SIGKILL)
    job = wait_terminal(target, job_id)
    assert_service_back(service_host, job, "supervisor SIGKILL: guard restores", job["state"])
    assert job["state"] in ("FAILED", "LOST")
    assert "guard" in job["message"] or "supervisor" in job["message"]
    payload_pid = job["payload"]["pid"]
    assert service_host.ssh(["kill", "-0", str(payload_pid)]).returncode != 0  # payload group killed too


GATED = """
import os, sys, time
gate = sys.argv[1]
while not os.path.exists(gate):
    time.sleep(0.05)
"""


def test_unit_that_fails_to_start_again_is_reported(service_host, work):
    target = target_for(service_host)
    script = work / "gated.py"
    script.write_text(GATED)
    gate = work / "gate"
    job_id = submit(target, gpu_job(work, service_host, stop="always", command=["python3", str(script), str(gate)]))
    wait_for(lambda: status(target, job_id)["state"] == "RUNNING", what="running")
    service_host.install_unit(fail_on_start=True)  # the service breaks while the job runs
    gate.touch()
    job = wait_terminal(target, job_id)
    now = service_host.service_state()
    record("unit fails to start again", job, expected="FAILED", service_now=now, healthy=False,
           note="reported; restore-service exit 1 with the unit's log")
    assert job["state"] == "FAILED" and job["service"]["healthy"] is False
    assert run_cli(target, "tail", job_id, "-f", "--max-wait", "10").returncode == 1
    restore = run_cli(target, "restore-service", "--host", service_host.alias, "--unit", service_host.unit,
                      "--max-wait", "5")
    assert restore.returncode == 1, restore.stdout.decode() + restore.stderr.decode()
    assert b"failed" in restore.stdout
    assert b"fail-on-start" in restore.stdout or b"exit" in restore.stdout.lower()


def test_second_submit_while_one_runs_is_busy(service_host, work):
    target = target_for(service_host)
    first = submit(target, gpu_job(work, service_host, stop="always", command=HANG))
    done = run_cli(target, "submit", str(gpu_job(work, service_host, stop="always", command=HANG)))
    assert done.returncode == 5, done.stderr.decode()
    assert first.encode() in done.stderr
    run_cli(target, "cancel", first)
    job = wait_terminal(target, first)
    assert_service_back(service_host, job, "second submit while one runs: exit 5 naming holder", "CANCELLED")


def test_sudo_path_as_non_root(service_host, work):
    user = service_host.as_user(service_host.sudo_user)
    target = target_for(service_host, alias=user.alias)
    job_id = submit(target, gpu_job(work, service_host, stop="always", command=["python3", HOLD, "1000", "1"],
                                     target=target, sudo=True))
    job = wait_terminal(target, job_id)
    assert_service_back(service_host, job, "sudo -n as non-root user", "SUCCEEDED")
    assert job["service"]["stopped"] is True


def test_sudo_without_rule_fails_clearly(service_host, work):
    user = service_host.as_user(service_host.nosudo_user)
    target = target_for(service_host, alias=user.alias)
    done = run_cli(target, "submit", str(gpu_job(work, service_host, stop="always", target=target, sudo=True)), "--json")
    if done.returncode == 0:  # refused on the host when the stop is attempted, not at preflight
        message = wait_terminal(target, json.loads(done.stdout)["job_id"])["message"]
    else:
        message = done.stderr.decode() + done.stdout.decode()  # --json: the error is a JSON object on stdout
    assert "NOPASSWD" in message or "password" in message
    assert service_host.service_state() == "active"


def test_restore_service_returns_within_max_wait_on_slow_unit(service_host):
    service_host.install_unit(start_delay=8)
    service_host.systemctl("stop", service_host.unit).check_returncode()
    target = target_for(service_host)
    t0 = time.monotonic()
    first = run_cli(target, "restore-service", "--host", service_host.alias, "--unit", service_host.unit,
                    "--health-url", service_host.health_url, "--max-wait", "2")
    elapsed = time.monotonic() - t0
    assert first.returncode == 75, first.stdout.decode() + first.stderr.decode()
    assert elapsed < 10, f"restore-service --max-wait 2 took {elapsed:.1f}s"
    deadline = time.monotonic() + 60
    while True:
        again = run_cli(target, "restore-service", "--host", service_host.alias, "--unit", service_host.unit,
                        "--health-url", service_host.health_url, "--max-wait", "5")
        if again.returncode != 75 or time.monotonic() > deadline:
            break
    assert again.returncode == 0, again.stdout.decode()
    assert service_host.health_status() == 200
    record("restore-service --max-wait 2 on a unit that needs ~10 s to be healthy",
           {"state": "exit 75, then 0", "service": {"was": "inactive"}}, expected="exit 75, then 0",
           service_now=service_host.service_state(), healthy=True,
           note=f"first call returned exit 75 after {elapsed:.2f} s; a later call exit 0 (healthy)")
