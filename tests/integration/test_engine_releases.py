"""Each engine release runner supports, end to end through `runner submit` on the confined systemd + sshd test host,
its unit the release's stand-in (tests/hosts/engine_standin.py --version: that release's routes, modes and idle rule,
read from its wheel) under a saturating load (looping clients, no think time): what the clients saw (no request
aborted, truncated or refused), what runner reported of it, and every restorer's resume after SIGKILL of supervisor +
guard inside the window."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.cli_helpers import run_cli, status, submit, wait_for, wait_terminal
from tests.harness.systemd_jobs import (HANG, assert_service_back, calls, gpu_job, hold, host_status, main_pid,
                                        restored_within, standin_state, target_for)

pytestmark = pytest.mark.systemd
SATURATING = ("--clients", "3", "--request-s", "1.5", "--loop", "--start-load")
KEY, ADMIN_KEY = "sk-runner-test-6f1c2a", "sk-runner-admin-93be70"  # hostile enough: what must be written nowhere


def test_vllm_from_0_17_sleeps_once_the_requests_in_flight_have_finished(service_host, work):
    log = service_host.install_engine_unit("vllm", "--version", "0.17.0", "--dev-mode", "--sleep-mode", *SATURATING)
    pid = main_pid(service_host)
    target = target_for(service_host)
    job = wait_terminal(target, submit(target, gpu_job(work, service_host, need=100000, command=hold(100000),
                                                       free="vllm")))
    assert_service_back(service_host, job, "free: vllm 0.17 under a saturating load", "SUCCEEDED")
    load = standin_state(service_host)["load"]
    assert (load["truncated"], load["failed"], load["refused"]) == (0, 0, 0), load
    assert load["completed"] >= 3 and load["ever_held"] >= 1, load
    assert [c for c in calls(log) if c.startswith("POST")] == ["POST /sleep", "POST /wake_up"]
    assert main_pid(service_host) == pid


def held_as_clients_saw(load: dict) -> float:
    return load["first_served_at"] - load["first_held_at"]


def test_sglang_from_0_5_21_holds_every_request_of_a_saturating_load_and_aborts_none(service_host, work):
    log = service_host.install_engine_unit("sglang", "--version", "0.5.21", "--memory-saver", *SATURATING)
    pid = main_pid(service_host)
    target = target_for(service_host)
    job = wait_terminal(target, submit(target, gpu_job(work, service_host, need=30000, command=hold(30000),
                                                       free="sglang")))
    assert_service_back(service_host, job, "free: sglang 0.5.21 (retract) under a saturating load", "SUCCEEDED")
    wait_for(lambda: standin_state(service_host)["load"]["completed"] >= 6, what="the held requests completed")
    load = standin_state(service_host)["load"]
    assert (load["truncated"], load["failed"], load["refused"]) == (0, 0, 0), load
    posts = [c for c in calls(log) if c.startswith("POST")]
    assert posts == ['POST /pause_generation {"mode": "retract"}', "POST /flush_cache",
                     'POST /release_memory_occupation {"tags": ["kv_cache"]}',
                     'POST /resume_memory_occupation {"tags": ["kv_cache"]}', "POST /continue_generation {}"]
    assert "GET /v1/loads" in calls(log) and "GET /get_load" not in calls(log)  # gone from 0.5.21
    clients = job["service"]["downtime"]["clients"]
    assert clients == dict(clients, at_pause=3, held=3, aborted=0, truncated=0, refused=0), clients
    # runner's hold (pause to serving again) is what the clients saw (first held to first served)
    assert abs(clients["hold_s"] - held_as_clients_saw(load)) < 2.0, (clients, load)
    assert main_pid(service_host) == pid
    shown = run_cli(target, "status", job["job_id"]).stdout.decode()
    assert "clients (retract): 3 in flight at the pause: 3 held, 0 aborted, 0 truncated, 0 refused; held " in shown


def test_vllm_before_0_17_pauses_until_the_requests_in_flight_finish_then_sleeps(service_host, work):
    log = service_host.install_engine_unit("vllm", "--version", "0.12.0", "--dev-mode", "--sleep-mode", *SATURATING)
    target = target_for(service_host)
    job = wait_terminal(target, submit(target, gpu_job(work, service_host, need=100000, command=hold(100000),
                                                       free="vllm")))
    assert_service_back(service_host, job, "free: vllm 0.12 under a saturating load", "SUCCEEDED")
    load = standin_state(service_host)["load"]
    assert (load["truncated"], load["failed"], load["refused"]) == (0, 0, 0), load
    assert [c for c in calls(log) if c.startswith("POST")] == ["POST /pause", "POST /sleep", "POST /wake_up",
                                                               "POST /resume"]
    assert job["service"]["downtime"]["clients"]["completed"] == 3


@pytest.mark.parametrize("engine, version, flags", [
    ("sglang", "0.5.21", ("--memory-saver",)), ("vllm", "0.12.0", ("--dev-mode", "--sleep-mode")),
    ("vllm", "0.17.0", ("--dev-mode", "--sleep-mode"))])
def test_supervisor_and_guard_sigkilled_in_the_window_the_engine_resumed_with_no_call(service_host, work, engine,
                                                                                       version, flags):
    service_host.install_engine_unit(engine, "--version", version, *flags, *SATURATING)
    pid = main_pid(service_host)
    target = target_for(service_host)
    job_id = submit(target, gpu_job(work, service_host, need=30000, command=HANG, free=engine))
    wait_for(lambda: status(target, job_id)["state"] == "RUNNING", what="running")
    job = host_status(service_host, job_id)
    assert standin_state(service_host)["on_gpu"]["kv_cache"] is False  # released: the window
    service_host.ssh(["kill", "-KILL", str(job["supervisor"]["pid"]), str(job["guard"]["pid"])], check=True)
    restored_within(service_host, job_id, timeout=90)
    job = host_status(service_host, job_id)
    assert_service_back(service_host, job, f"free: {engine} {version}, SIGKILL in the window", job["state"])
    assert job["service"]["resumed"]["how"] == "api" and main_pid(service_host) == pid
    state = standin_state(service_host)
    assert not state["paused"] and not state["sleeping"] and state["on_gpu"]["kv_cache"]
    assert (state["load"]["truncated"], state["load"]["failed"]) == (0, 0), state["load"]


def test_an_engine_that_wants_a_key_is_refused_naming_the_field(service_host, work):
    log = service_host.install_engine_unit("sglang", "--version", "0.5.21", "--memory-saver", "--api-key", KEY)
    target = target_for(service_host)
    done = run_cli(target, "submit", str(gpu_job(work, service_host, need=30000, command=hold(30000),
                                                 free="sglang")))
    assert done.returncode == 4, done.stderr.decode()
    assert "answered 401: the engine wants an API key; name where it lives on the host with service.api_key" in \
        done.stderr.decode()
    assert calls(log) == ["GET /server_info"]
    wrong = service_host.workdir / "wrong-key"
    wrong.write_text("not-the-key\n")
    done = run_cli(target, "submit", str(gpu_job(work, service_host, need=30000, command=hold(30000),
                                                 free="sglang", api_key=f"file:{wrong}")))
    assert done.returncode == 4 and f"refused the key of service.api_key (file:{wrong})" in done.stderr.decode()


def test_the_key_is_read_where_it_lives_sent_on_every_call_and_written_nowhere(service_host, work):
    """--api-key from the unit's own Environment= (env:), --admin-api-key from a root-only file (file:)."""
    admin = service_host.workdir / "admin-key"
    admin.write_text(ADMIN_KEY + "\n")
    admin.chmod(0o600)
    log = service_host.install_engine_unit("sglang", "--version", "0.5.21", "--memory-saver", "--api-key", KEY,
                                           "--admin-api-key", ADMIN_KEY, *SATURATING,
                                           environment={"SGLANG_API_KEY": KEY})
    target = target_for(service_host)
    job_file = gpu_job(work, service_host, need=30000, command=hold(30000), free="sglang",
                       api_key="env:SGLANG_API_KEY", admin_api_key=f"file:{admin}")
    done = run_cli(target, "submit", str(job_file), "--json")
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    job = wait_terminal(target, json.loads(done.stdout)["job_id"])
    assert_service_back(service_host, job, "free: sglang with its keys", "SUCCEEDED")
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    unopen = [c for c in sent if not c["path"].startswith(("/health", "/standin_state"))]
    assert unopen and all(c["auth"] == "Bearer" for c in unopen), unopen
    for where in ("/root/.runner",):
        found = service_host.ssh(["grep", "-rlF", "-e", KEY, "-e", ADMIN_KEY, where])
        assert found.returncode == 1 and not found.stdout.strip(), found.stdout  # 1: no file holds either
    local = subprocess.run(["grep", "-rlF", "-e", KEY, "-e", ADMIN_KEY, os.environ["RUNNER_STATE_DIR"], str(work)],
                           capture_output=True, text=True)
    assert local.returncode == 1 and not local.stdout.strip(), local.stdout


def test_the_dry_run_says_the_sequence_that_will_run_and_touches_nothing(service_host, work):
    log = service_host.install_engine_unit("sglang", "--version", "0.5.21", "--memory-saver")
    target = target_for(service_host)
    done = run_cli(target, "submit", str(gpu_job(work, service_host, need=30000, command=hold(30000),
                                                 free="sglang")), "--dry-run")
    shown = done.stdout.decode()
    assert done.returncode == 0 and "WOULD BE STOPPED" not in shown, shown
    assert "its GPU memory WOULD BE RELEASED through its sglang API" in shown, shown
    assert "0.5.21 pause_generation retract (requests in flight go back to its queue, none aborted)" in shown, shown
    assert not [c for c in calls(log) if c.startswith("POST")]
