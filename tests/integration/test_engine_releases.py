"""Each engine release runner supports, end to end through `runner submit` on the confined systemd + sshd test host,
its unit the release's stand-in (tests/hosts/engine_standin.py --version: that release's routes, modes and idle rule,
read from its wheel) under a saturating load (looping clients, no think time): what the clients saw (no request
aborted, truncated or refused), what runner reported of it, and every restorer's resume after SIGKILL of supervisor +
guard inside the window."""
from __future__ import annotations

import pytest

from tests.cli_helpers import submit, wait_terminal
from tests.harness.systemd_jobs import assert_service_back, calls, gpu_job, hold, main_pid, standin_state, target_for

pytestmark = pytest.mark.systemd
SATURATING = ("--clients", "3", "--request-s", "1.5", "--loop", "--start-load")


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
