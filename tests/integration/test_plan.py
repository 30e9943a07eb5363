"""One plan per command: `runner submit` validates the spec (pydantic) and checks a script's args (in a child
interpreter) once, whether it starts one job or rolls out a fleet of N hosts; the plan says whether it is a
fleet and is retargeted to each host without another validation. Counted in process, through cli.main."""
from __future__ import annotations

import json

import pytest
import yaml

from runner.cli import cli
from runner.commands.controller import local_plan
from runner.spec import payload_args, spec_load
from tests.cli_helpers import Target, wait_terminal, write_job
from tests.hosts._proc import shared_tmpdir

ALIASES = ("plan-a", "plan-b", "plan-c")
ARGS = {"seconds": 0.2, "sizes": "1,2"}


@pytest.fixture
def counted(monkeypatch) -> dict:
    """How often this process validates a spec and starts an args-check child."""
    counts = {"validations": 0, "args_checks": 0}
    real_load, real_check = spec_load.load_spec, payload_args.check_many

    def load(*args, **kwargs):
        counts["validations"] += 1
        return real_load(*args, **kwargs)

    def check(*args, **kwargs):
        counts["args_checks"] += 1
        return real_check(*args, **kwargs)

    monkeypatch.setattr(spec_load, "load_spec", load)
    monkeypatch.setattr(payload_args, "check_many", check)
    return counts


def run_main(capsys, *argv: str) -> tuple[int, dict]:
    with pytest.raises(SystemExit) as stop:
        cli.main(list(argv))
    out = capsys.readouterr().out
    return stop.value.code, json.loads(out) if out.strip() else {}


def local_target() -> Target:
    root = shared_tmpdir("runner-root-plan1-")
    return Target("local", {"address": "local", "root": str(root)}, root, {})


def test_a_job_submit_validates_once(tmp_path, counted, capsys):
    target = local_target()
    job = write_job(tmp_path / "job.yaml", target, script="demo_payload.py", args=ARGS)
    code, done = run_main(capsys, "submit", str(job), "--json")
    assert code == 0, done
    assert counted == {"validations": 1, "args_checks": 1}
    assert wait_terminal(target, done["job_id"])["state"] == "SUCCEEDED"


def test_a_dry_run_validates_once(tmp_path, counted, capsys):
    job = write_job(tmp_path / "job.yaml", local_target(), script="demo_payload.py", args=ARGS)
    code, decided = run_main(capsys, "submit", str(job), "--dry-run", "--json")
    assert code == 0, decided
    assert counted == {"validations": 1, "args_checks": 1}


def fleet_job(ssh_host, work) -> str:
    """A fleet of len(ALIASES) hosts: each alias names the one loopback sshd (its root login)."""
    block = ssh_host.ssh_config.read_text().split("\n\n")[0]
    (work / "ssh_config").write_text("\n\n".join(block.replace("Host testhost", f"Host {alias}", 1)
                                                 for alias in ALIASES) + "\n")
    spec = {"name": "plan fleet", "host": {"address": list(ALIASES), "root": str(work / "root")},
            "service": {"manager": "none"}, "payload": {"script": "demo_payload.py", "args": ARGS},
            "limits": {"max_runtime": "1m", "grace": "2s"}, "rollout": {"max_unavailable": len(ALIASES)}}
    path = work / "fleet.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(path)


def test_a_fleet_submit_of_n_hosts_validates_once(ssh_host, counted, capsys, monkeypatch):
    work = shared_tmpdir("runner-plan-fleet-")
    job = fleet_job(ssh_host, work)
    monkeypatch.setenv("RUNNER_SSH_CONFIG", str(work / "ssh_config"))
    code, run = run_main(capsys, "submit", job, "--json", "--max-wait", "60")
    assert code == 0, run
    assert [h["phase"] for h in run["hosts"]] == ["done"] * len(ALIASES), run
    assert counted == {"validations": 1, "args_checks": 1}


def test_a_fleet_dry_run_of_n_hosts_validates_once(ssh_host, counted, capsys, monkeypatch):
    work = shared_tmpdir("runner-plan-fleetdry-")
    job = fleet_job(ssh_host, work)
    monkeypatch.setenv("RUNNER_SSH_CONFIG", str(work / "ssh_config"))
    with pytest.raises(SystemExit) as stop:
        cli.main(["submit", job, "--dry-run"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.count("the service is left running") == len(ALIASES)
    assert counted == {"validations": 1, "args_checks": 1}


def test_the_plan_says_fleet_and_retargets_without_validating(tmp_path, ssh_host, counted):
    plan = local_plan(fleet_job(ssh_host, shared_tmpdir("runner-plan-obj-")), [])
    assert plan.is_fleet and plan.addresses == list(ALIASES) and plan.rollout["max_unavailable"] == len(ALIASES)
    one = plan.for_address("plan-b")
    assert not one.is_fleet and one.host["address"] == "plan-b" and one.wire == plan.wire
    assert one.bundle.digest == plan.bundle.digest and one.wire_for("x-1")["job_id"] == "x-1"
    assert counted == {"validations": 1, "args_checks": 1}  # once for the run: retargeting validates nothing
