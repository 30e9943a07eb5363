"""A mistake in the service section is found by the preflight, before anything is touched, on the confined
systemd host: a unit that does not exist, a health URL that does not answer while the service serves; and a
queued submit says what will happen to a service another job holds stopped."""
from __future__ import annotations

import json
import time

import pytest

from tests.cli_helpers import Target, run_cli, wait_for, wait_terminal, write_job
from tests.harness.pace import Scale
from tests.hosts._proc import shared_tmpdir

pytestmark = pytest.mark.systemd


def service_target(host) -> Target:
    return Target("ssh", {"address": host.alias}, shared_tmpdir("unused-"), {"RUNNER_SSH_CONFIG": str(host.ssh_config)},
                  host)


def job(tmp_path, host, name: str = "job", *, command=None, gpu=None, **service) -> str:
    section = {"manager": "systemd", "unit": host.unit, "stop": "always", "health_url": host.health_url,
               "health_timeout": "30s", **service}
    return str(write_job(tmp_path / f"{name}.yaml", service_target(host), command=command or ["true"], grace="2s",
                         service=section, gpu=gpu))


def main_pid(host) -> str:
    return host.systemctl("show", "-P", "MainPID", host.unit).stdout.strip()


def timed(target: Target, *args: str):
    began = time.monotonic()
    done = run_cli(target, *args)
    return done, time.monotonic() - began


def test_a_unit_that_does_not_exist_is_refused_at_once(service_host, tmp_path):
    host, scale = service_host, Scale()
    target = service_target(host)
    spec = job(tmp_path, host, unit="nosuch-llm.service")
    for args in (("submit", spec, "--dry-run"), ("submit", spec)):
        done, took = timed(target, *args)
        assert done.returncode == 4, (args, done.stderr)
        assert b"no unit nosuch-llm.service on " in done.stderr, done.stderr
        assert took < scale(15), (args, took)
    assert json.loads(run_cli(target, "list", "--json").stdout) == []  # refused: nothing to follow or forget
    done, took = timed(target, "restore-service", "--host", host.alias, "--unit", "nosuch-llm.service",
                       "--max-wait", "60")
    assert done.returncode == 4, done
    assert b"no unit nosuch-llm.service on " in done.stderr and took < scale(15), (done.stderr, took)
    assert host.service_state() == "active"


def test_a_health_url_that_does_not_answer_is_refused_before_the_stop(service_host, tmp_path):
    host = service_host
    target = service_target(host)
    wrong = "http://127.0.0.1:9/health"  # the discard port: nothing listens
    assert wrong != host.health_url and host.health_status() == 200
    before = main_pid(host)
    spec = job(tmp_path, host, health_url=wrong)
    for args in (("submit", spec, "--dry-run"), ("submit", spec)):
        done = run_cli(target, *args)
        assert done.returncode == 4, (args, done.stderr)
        assert b"service.health_url" in done.stderr and wrong.encode() in done.stderr, done.stderr
    assert host.service_state() == "active" and main_pid(host) == before  # never stopped
    assert run_cli(target, "submit", job(tmp_path, host, "right"), "--dry-run").returncode == 0


def test_a_queued_submit_behind_a_job_holding_the_service_stopped_says_so(service_host, tmp_path):
    """The queued job's memory is short only while the unit serves: free now (the holder stopped it), short
    again once the holder's end starts it, so the queued job stops it a second time."""
    host = service_host
    host.set_gpu(total_mib=20000, baseline_used=10000)  # the unit holds 4096 of it while active
    target = service_target(host)
    holder = json.loads(run_cli(target, "submit", job(tmp_path, host, "holder", command=["sleep", "60"]),
                                "--json").stdout)["job_id"]
    try:
        wait_for(lambda: host.service_state() == "inactive", 60, "the holder's stop")
        queued = job(tmp_path, host, "queued", stop="if-needed", gpu={"devices": [0], "min_free_mib": 8000})
        done = run_cli(target, "submit", queued, "--queue", "--dry-run")
        assert done.returncode == 0, done.stderr
        said = " ".join(done.stdout.decode().split())
        assert f"queued behind job {holder}" in said, said
        assert f"{holder} stopped {host.unit} and starts it again when it ends" in said, said
    finally:
        run_cli(target, "cancel", holder)
    wait_terminal(target, holder)
    wait_for(lambda: host.service_state() == "active", 60, "the restore")
