"""Stopping an engine's unit (remote_payload/host/unit_stop.py): under the default KillMode=control-group an
SGLang/vLLM unit is slow to stop and left `failed`. The preflight warns (a note in the verdict, never a
refusal); a stop that leaves the unit failed is recorded as the stop's doing and cleared (`reset-failed`)
before the start. Pure parsers on captured `systemctl show` output, then the confined systemd host with a
unit shaped like SGLang's launcher (tests/hosts/sglang_launcher.py: a child that exits 3 on SIGTERM).
"""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from remote_payload.admission import admit
from remote_payload.host import unit_stop
from tests.cli_helpers import run_cli, status, submit, wait_for, wait_terminal, write_job
from tests.harness.systemd_jobs import host_status, service_section, target_for
from tests.hosts._proc import shared_tmpdir
from tests.hosts.systemd_host import HOST_PYTHON, dummy_unit_text, wait_until

DATA = Path(__file__).parents[1] / "data" / "systemctl"
LAUNCHER = Path(__file__).parents[1] / "hosts" / "sglang_launcher.py"


def settings(name: str) -> dict:
    return unit_stop.parse_properties((DATA / name).read_text())


# -- pure ------------------------------------------------------------------------------------------------------

def test_the_exec_start_command_is_read_from_systemds_record():
    found = settings("show-stop-sglang-control-group.txt")
    assert found["KillMode"] == "control-group" and found["TimeoutStopUSec"] == "1min 30s"
    command = unit_stop.exec_command(found["ExecStart"])
    assert command.startswith("/usr/bin/python3 /tmp/") and command.endswith("--release-delay 0.5")
    assert unit_stop.exec_command("/usr/bin/odd") == "/usr/bin/odd"


@pytest.mark.parametrize("name, warned", [
    ("show-stop-sglang-control-group.txt", "sglang"),
    ("show-stop-vllm-control-group.txt", "vllm"),
    ("show-stop-sglang-mixed.txt", None),
    ("show-stop-plain-control-group.txt", None),
])
def test_a_slow_stop_is_hinted_only_for_an_engine_under_control_group(name, warned):
    hint = unit_stop.slow_stop_hint("llm.service", settings(name))
    if warned is None:
        assert hint is None
        return
    assert hint.startswith(f"llm.service runs {warned} with KillMode=control-group") and "KillMode=mixed" in hint
    assert unit_stop.slow_stop_hint("llm.service", {}) is None


def test_the_result_after_a_stop_that_left_the_unit_failed():
    found = unit_stop.parse_properties((DATA / "show-result-after-stop.txt").read_text())
    assert found["ActiveState"] == "failed" and found["Result"] == "exit-code"


def wire(stop: str) -> dict:
    return {"job_id": "j", "gpu": {"devices": [], "required_mib": 0},
            "service": {"manager": "systemd", "unit": "llm.service", "stop": stop, "free": "stop"}}


def test_the_verdict_warns_only_when_the_job_will_stop_the_unit():
    report = {"gpus": [], "locks": [], "service": {"unit": "llm.service", "active_state": "active",
                                                    "stop_hint": "llm.service runs sglang with KillMode=control-group"}}
    verdict = admit(wire("always"), report)
    assert verdict["start"] and verdict["stop_service"]
    assert "warning: llm.service runs sglang with KillMode=control-group" in verdict["notes"]
    kept = admit(wire("if-needed"), report)
    assert not kept["stop_service"] and not any(n.startswith("warning:") for n in kept["notes"])


# -- the confined systemd host -----------------------------------------------------------------------------------

@pytest.fixture
def engine_unit(service_host):
    """The test unit run through the SGLang-shaped launcher (default KillMode), active and healthy."""
    host = service_host
    lines = dummy_unit_text(host.service_log, port=host.service_port).splitlines()
    (host.units_dir / host.unit).write_text("\n".join(
        f"ExecStart={shlex.join([HOST_PYTHON, str(LAUNCHER)])} {line[len('ExecStart='):]}"
        if line.startswith("ExecStart=") else line for line in lines) + "\n")
    host.systemctl("daemon-reload").check_returncode()
    host.systemctl("restart", host.unit).check_returncode()
    wait_until(lambda: host.health_status() == 200, timeout=20, what=f"{host.unit} (launcher) healthy")
    return host


PAYLOAD = """\
import os, subprocess, sys, time
unit, flag = sys.argv[1], sys.argv[2]
state = subprocess.run(["systemctl", "is-active", unit], capture_output=True, text=True).stdout.strip()
print("payload-saw-" + state, flush=True)
deadline = time.time() + 30
while not os.path.exists(flag) and time.time() < deadline:
    time.sleep(0.1)
"""


def engine_job(host, work: Path):
    (work / "payload.py").write_text(PAYLOAD)
    (work / "payload.py").chmod(0o644)
    target = target_for(host)
    flag = f"/tmp/runner-unit-stop-{work.name}"
    path = write_job(work / "job.yaml", target, command=["python3", str(work / "payload.py"), host.unit, flag],
                     service=service_section(host, "always"), max_runtime="1m", grace="2s")
    return target, path, flag


def test_the_preflight_warns_that_the_engines_unit_is_slow_to_stop(engine_unit):
    target, path, _ = engine_job(engine_unit, shared_tmpdir("runner-unitstop-"))
    done = run_cli(target, "submit", str(path), "--dry-run")
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "WOULD BE STOPPED" in out and f"warning: {engine_unit.unit} runs sglang with KillMode=control-group" in out
    spec = yaml.safe_load(path.read_text())
    spec["service"]["stop"] = "never"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    quiet = run_cli(target, "submit", str(path), "--dry-run")
    assert quiet.returncode == 0 and "KillMode" not in quiet.stdout.decode()


def test_a_plain_unit_gets_no_warning(service_host):
    target, path, _ = engine_job(service_host, shared_tmpdir("runner-unitstop-"))
    done = run_cli(target, "submit", str(path), "--dry-run")
    assert done.returncode == 0 and "WOULD BE STOPPED" in done.stdout.decode()
    assert "KillMode" not in done.stdout.decode()


def test_a_unit_left_failed_by_the_stop_is_said_to_be_and_reset_before_the_start(engine_unit):
    host = engine_unit
    target, path, flag = engine_job(host, shared_tmpdir("runner-unitstop-"))
    job_id = submit(target, path)
    try:
        wait_for(lambda: "payload-saw-" in host.ssh(["cat", f"/root/.runner/jobs/{job_id}/output.log"]).stdout,
                 timeout=30, what="the payload's look at the unit")
        running = status(target, job_id)
        assert running["service"]["now"] == "failed", running["service"]
        assert running["service"]["stop_result"] == {"state": "failed", "result": "exit-code",
                                                     "by": "this job's stop"}, running["service"]
        text = run_cli(target, "status", job_id).stdout.decode()
        assert "now failed (left failed by this job's stop, Result=exit-code" in text, text
    finally:
        host.ssh(["touch", flag])
    job = wait_terminal(target, job_id)
    assert job["state"] == "SUCCEEDED" and job["service"]["healthy"] is True, job
    assert host.service_state() == "active" and host.health_status() == 200
    restore_log = host.ssh(["cat", f"/root/.runner/jobs/{job_id}/restore.log"]).stdout
    assert "left failed by this job's stop (Result=exit-code): reset-failed before the start" in restore_log
    assert host_status(host, job_id)["service"]["now"] == "active"
