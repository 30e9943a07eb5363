"""`runner submit --dry-run` says each step in its place: what runs before the stop (prepare, a staged
payload's setup), what runs in the window, and how each service is freed (stopped, its memory released, or left
serving).
"""
from __future__ import annotations

import json

import yaml

from runner.commands.render import dry_run_steps
from tests.cli_helpers import local_target, run_cli, write_job


def test_dry_run_shows_what_runs_before_the_stop_in_the_window_and_what_is_freed(work):
    target = local_target({"RUNNER_STATE_DIR": str(work / "state")})
    path = write_job(work / "j.yaml", target, command=["sleep", "1"])
    spec = yaml.safe_load(path.read_text())
    spec["payload"].update(prepare_command=["echo", "warm up"], staged=True)
    path.write_text(yaml.safe_dump(spec))
    done = run_cli(target, "submit", str(path), "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    steps = json.loads(done.stdout)["steps"]
    assert steps["before_stop"][0].startswith("prepare: echo 'warm up'"), steps
    assert "staged: sleep 1 starts and does its GPU-free setup" in steps["before_stop"][1], steps
    assert steps["window"] == ["payload: sleep 1 (gets the GPU with `go`; limits.max_runtime 300 s)"], steps
    assert steps["freed"] == ["nothing: no service to free (service.manager none)"], steps
    text = run_cli(target, "submit", str(path), "--dry-run").stdout.decode()
    assert "before the stop prepare: echo 'warm up'" in text and "in the window   payload: sleep 1" in text, text


def test_dry_run_says_how_each_freeing_method_frees():
    wire = {"payload": {"command": ["x"], "prepare": None}, "limits": {"max_runtime": 60.0},
            "service": {"manager": "systemd", "unit": "llm.service", "free": "sglang"}}
    assert dry_run_steps(wire, ["x"], stop=True)["freed"] == [
        "llm.service: free: sglang — pause generation and release its GPU memory; resume after (the unit keeps running)"]
    assert dry_run_steps(wire, ["x"], stop=False)["freed"] == ["llm.service: left serving (not freed)"]
    stop = dict(wire, service={"manager": "systemd", "unit": "llm.service"})
    assert dry_run_steps(stop, ["x"], stop=True)["freed"] == ["llm.service: free: stop — stopped; started again after"]
    assert dry_run_steps(stop, ["x"], stop=True)["before_stop"] == []
