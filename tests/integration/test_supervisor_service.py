"""remote_payload/supervisor.py on the confined real systemd test host, called over its sshd like the
controller calls it: the service stopped for a job and restored healthy, if-needed/never, the guard's
restore, restore-service, sudo logins. The same payload script as tests/integration/test_supervisor.py (tests/harness/supervisor_calls.py)."""
from __future__ import annotations

import json
import os
import signal

import pytest

from tests.harness.supervisor_calls import RemoteHost


@pytest.fixture
def remote(service_host):
    r = RemoteHost(service_host)
    yield r
    r.cleanup()


@pytest.mark.systemd
def test_service_is_stopped_for_the_job_and_restored_healthy(remote):
    assert remote.call("start", "--job-id", "s1", spec=remote.spec("always", "sleep", "0.5", "0"))["ok"]
    status = remote.wait("s1", "SUCCEEDED", "FAILED")
    service = status["service"]
    assert status["state"] == "SUCCEEDED", status
    assert service["was"] == "active" and service["stopped"] and service["healthy"] and service["now"] == "active"
    assert service["downtime_s"] > 0 and remote.sh.service_state() == "active"
    assert remote.sh.health_status() == 200
    events = [json.loads(line) for line in (remote.root / "jobs" / "s1" / "events.jsonl").read_text().splitlines()]
    assert "STOPPING_SERVICE" in [e.get("state") for e in events]
    timer = [e for e in events if e["event"] == "guard-timer"]
    assert timer[0]["created"] is True and timer[0]["unit"] == "runner-guard-s1.timer"
    assert remote.sh.systemctl("is-active", "runner-guard-s1.timer").stdout.strip() == "inactive"  # stopped


@pytest.mark.systemd
def test_if_needed_stops_only_when_memory_is_short(remote):
    remote.sh.install_unit(hold_mib=140000)
    remote.sh.systemctl("restart", remote.sh.unit).check_returncode()
    assert remote.call("start", "--job-id", "n1", spec=remote.spec("if-needed", "sleep", "0", "0"))["ok"]
    status = remote.wait("n1", "SUCCEEDED", "FAILED")
    assert status["state"] == "SUCCEEDED" and status["service"]["stopped"] is True, status
    assert status["gpu"]["before"][0]["free_mib"] < 9100
    assert remote.call("start", "--job-id", "n2", spec=remote.spec("if-needed", "sleep", "0", "0", required=100))["ok"]
    status = remote.wait("n2", "SUCCEEDED", "FAILED")
    assert status["state"] == "SUCCEEDED" and status["service"]["stopped"] is False  # 100 MiB fit beside it
    assert status["service"]["now"] == "active" and status["service"]["healthy"] is True


@pytest.mark.systemd
def test_never_with_short_memory_fails_without_touching_the_service(remote):
    remote.sh.install_unit(hold_mib=140000)
    remote.sh.systemctl("restart", remote.sh.unit).check_returncode()
    assert remote.call("start", "--job-id", "v", spec=remote.spec("never", "sleep", "0", "0", drain=1))["ok"]
    status = remote.wait("v", "FAILED")
    assert "memory is held by pid" in status["message"] and status["service"]["stopped"] is False
    assert remote.sh.service_state() == "active"


@pytest.mark.systemd
def test_guard_restores_the_service_after_the_supervisor_is_killed(remote):
    answer = remote.call("start", "--job-id", "g", spec=remote.spec("always", "stubborn"))
    remote.wait("g", "RUNNING")
    assert remote.sh.service_state() != "active"
    os.kill(answer["supervisor_pid"], signal.SIGKILL)
    status = remote.wait("g", "FAILED")
    assert "guard restored the service" in status["message"] and status["service"]["healthy"] is True
    assert remote.sh.service_state() == "active"


@pytest.mark.systemd
def test_restore_service_starts_a_stopped_unit_and_reports_a_broken_one(remote):
    unit = remote.sh.unit
    remote.sh.systemctl("stop", unit).check_returncode()
    answer = remote.call("restore-service", "--unit", unit, "--health-url", remote.sh.health_url, "--max-wait", "20")
    assert answer["state"] == "healthy" and answer["active_state"] == "active"
    remote.sh.systemctl("stop", unit).check_returncode()
    answer = remote.call("restore-service", "--unit", unit, "--health-url", remote.sh.health_url, "--max-wait", "0.5")
    assert answer["state"] == "starting"  # health answers 503 for its ready delay
    remote.sh.install_unit(fail_on_start=True)
    remote.sh.systemctl("stop", unit)
    answer = remote.call("restore-service", "--unit", unit, "--max-wait", "10")
    assert answer["state"] == "failed" and answer["log_tail"]


@pytest.mark.systemd
def test_a_sudo_login_stops_and_restores_through_sudo(service_host):
    remote = RemoteHost(service_host, user=service_host.sudo_user, sudo=True)
    try:
        assert remote.call("start", "--job-id", "u", spec=remote.spec("always", "sleep", "0.5", "0"))["ok"]
        status = remote.wait("u", "SUCCEEDED", "FAILED")
        assert status["state"] == "SUCCEEDED" and status["service"]["stopped"] and status["service"]["healthy"], status
        # the sudoers rule covers systemctl only: the guard timer is refused, which is noted, not fatal
        timer = [json.loads(line) for line in (remote.root / "jobs" / "u" / "events.jsonl").read_text().splitlines()
                 if '"guard-timer"' in line]
        assert timer[0]["created"] is False and "NOPASSWD" in timer[0]["detail"]
    finally:
        remote.cleanup()


@pytest.mark.systemd
def test_sudo_that_wants_a_password_is_its_own_error(service_host):
    remote = RemoteHost(service_host, user=service_host.nosudo_user, sudo=True)
    try:
        answer = remote.call("restore-service", "--unit", service_host.unit, "--sudo", "--max-wait", "1")
        assert answer["ok"] is False and answer["error"] == "sudo-password" and "NOPASSWD" in answer["message"]
        answer = remote.call("preflight", spec=remote.spec("always", "sleep", "0", "0"))
        assert answer["error"] == "sudo-password"
    finally:
        remote.cleanup()
