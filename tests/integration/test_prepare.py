"""A payload's prepare step runs before the service is stopped (compile before the stop), on the real
confined systemd host: it sees the service active, the timed run sees it stopped, and a failing prepare step
ends the job with the service never touched."""
from __future__ import annotations

import pytest

from tests.case_report import record
from tests.cli_helpers import run_cli, submit, wait_terminal, write_job
from tests.harness.systemd_jobs import main_pid, service_section, target_for
from tests.hosts._proc import shared_tmpdir

pytestmark = pytest.mark.systemd


def saw(who: str, unit: str) -> list[str]:
    return ["sh", "-c", f"echo {who}-saw-$(systemctl is-active {unit})"]


def prepared_job(host, prepare: list[str]):
    target = target_for(host)
    path = write_job(shared_tmpdir("runner-prep-") / "job.yaml", target, command=saw("payload", host.unit),
                     service=service_section(host, "always"), max_runtime="1m", grace="2s")
    text = path.read_text().replace("payload:\n", "payload:\n  prepare_command: " + repr(prepare).replace("'", '"') + "\n", 1)
    path.write_text(text)
    return target, path


def test_the_prepare_step_runs_while_the_service_is_still_up(service_host):
    target, job_file = prepared_job(service_host, saw("prepare", service_host.unit))
    job_id = submit(target, job_file)
    job = wait_terminal(target, job_id)
    log = run_cli(target, "tail", job_id, "--from-start").stdout.decode()
    record("prepare step before the stop", job, expected="SUCCEEDED", service_now=service_host.service_state(),
           healthy=service_host.health_status() == 200)
    assert job["state"] == "SUCCEEDED", job
    assert "prepare-saw-active" in log and "payload-saw-inactive" in log, log
    assert log.index("prepare-saw") < log.index("payload-saw")
    assert job["prepare"]["exit_code"] == 0 and job["service"]["stopped"] is True
    assert service_host.service_state() == "active"


def test_a_failing_prepare_step_never_stops_the_service(service_host):
    before = main_pid(service_host)
    target, job_file = prepared_job(service_host, ["sh", "-c", "echo compile failed; exit 7"])
    job = wait_terminal(target, submit(target, job_file))
    record("prepare step fails", job, expected="FAILED", service_now=service_host.service_state(),
           healthy=service_host.health_status() == 200)
    assert job["state"] == "FAILED" and "prepare step exited with code 7" in job["message"], job
    assert job["service"]["stopped"] is False and main_pid(service_host) == before
