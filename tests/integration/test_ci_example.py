"""docs/ci-example.yml: parsed, and its `runner` steps run in order, as GitHub Actions would, on the local host.

The steps run under `bash -eo pipefail` (Actions' default shell) with GITHUB_OUTPUT / GITHUB_STEP_SUMMARY
files, `runner` on PATH, and the workflow's own env. The changes from the real run, all made here:
JOB_FILE is the demo job, its submit line gets `--set payload.args.seconds=3 --set host.root=<tmp>`, and the
baseline is saved from the job's own result (then a faster one is made to see the gate fail).
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from runner.results import gate

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / "docs" / "ci-example.yml"
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def steps() -> dict[str, dict]:
    return {step["name"]: step for step in workflow()["jobs"]["benchmark"]["steps"] if "name" in step}


class Actions:
    """Just enough of a runner: env, step outputs, the summary file, and `${{ }}` for what the workflow uses."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.outputs = tmp, {}
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        shim = bin_dir / "runner"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m runner "$@"\n')
        shim.chmod(0o755)
        self.summary, self.output_file = tmp / "summary.md", tmp / "github_output"
        job_env = {k: self.expand(str(v)) for k, v in workflow()["jobs"]["benchmark"]["env"].items()}
        self.env = {**os.environ, **job_env, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO),
                    "JOB_FILE": "jobs/demo.yaml", "BASELINE": str(tmp / "baseline.json"),
                    "GITHUB_RUN_ID": "4242", "GITHUB_RUN_ATTEMPT": "1",
                    "GITHUB_OUTPUT": str(self.output_file), "GITHUB_STEP_SUMMARY": str(self.summary)}

    def expand(self, text: str) -> str:
        def value(match: re.Match) -> str:
            expr = match.group(1)
            if expr == "runner.temp":
                return str(self.tmp / "runner-temp")
            found = re.fullmatch(r"steps\.(\w+)\.outputs\.(\w+)", expr)
            assert found, f"the test does not know the expression {expr!r}"
            return self.outputs.get(found[1], {}).get(found[2], "")
        return EXPRESSION.sub(value, text)

    def run(self, step: dict, edit=lambda script: script) -> subprocess.CompletedProcess:
        self.output_file.write_text("")
        script = edit(self.expand(step["run"]))
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=REPO,
                              env=self.env, capture_output=True, text=True, timeout=300)
        pairs = [line.split("=", 1) for line in self.output_file.read_text().splitlines() if "=" in line]
        self.outputs.setdefault(step.get("id", ""), {}).update(dict(pairs))
        return done

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["runner", *args], cwd=REPO, env=self.env, capture_output=True, text=True, timeout=120)


def test_the_workflow_is_valid_actions_yaml_with_the_steps_the_docs_promise():
    flow = workflow()
    assert True in flow or "on" in flow  # PyYAML reads the bare key `on` as True
    job = flow["jobs"]["benchmark"]
    assert "self-hosted" in job["runs-on"] and job["env"]["RUNNER_STATE_DIR"].startswith("${{ runner.temp }}")
    names = list(steps())
    assert names.index("Submit") < names.index("Wait for the job (log streams here)") < names.index("Gate against the baseline")
    assert any(s.get("uses", "").startswith("actions/upload-artifact") for s in job["steps"])
    runner_lines = [line.strip() for s in job["steps"] for line in s.get("run", "").splitlines() if "runner " in line]
    assert len(runner_lines) == 5 and all("${{" not in line or "steps.submit.outputs.job_id" in line for line in runner_lines)


def test_the_workflows_runner_lines_submit_wait_and_gate_the_demo_job(tmp_path):
    actions, step = Actions(tmp_path), steps()
    root = shlex.quote(f"host.root={tmp_path / 'host root'}")
    short = f'"$JOB_FILE" --set payload.args.seconds=3 --set {root}'
    submitted = actions.run(step["Submit"], edit=lambda s: s.replace('"$JOB_FILE"', short, 1))
    assert submitted.returncode == 0, submitted.stderr
    job_id = actions.outputs["submit"]["job_id"]
    assert job_id == "ci-4242-1"

    waited = actions.run(step["Wait for the job (log streams here)"])
    assert waited.returncode == 0, waited.stderr
    assert '"event": "done"' in waited.stdout and f"{job_id} ended SUCCEEDED" in waited.stderr

    saved = actions.cli("results", "--save-baseline", actions.env["BASELINE"], job_id)
    assert saved.returncode == 0, saved.stderr
    gated = actions.run(step["Gate against the baseline"])
    assert gated.returncode == 0, gated.stderr
    summary = actions.summary.read_text()
    assert summary.startswith("### Benchmark gate") and "PASSED, 4 metrics" in summary
    assert summary.count("| median_us(") == 4

    junit = actions.run(step["JUnit report"])
    assert junit.returncode == 0, junit.stderr
    cases = ET.parse(REPO / "gate-junit.xml").getroot().findall(".//testcase")
    assert sorted(c.get("name") for c in cases) == sorted(f"median_us({n})" for n in (1, 4, 16, 64))

    listed = actions.cli("history", "--metric", "median_us_64")
    assert listed.returncode == 0 and job_id in listed.stdout  # the collected result was recorded


def test_the_workflows_gate_fails_the_step_on_a_regression(tmp_path):
    actions, step = Actions(tmp_path), steps()
    result = {"payload": "demo", "rows": [{"size": 1, "median_us": 100.0}, {"size": 4, "median_us": 400.0}]}
    current = tmp_path / "result.json"
    current.write_text(json.dumps(result))
    faster = {**result, "rows": [{"size": 1, "median_us": 50.0}, {"size": 4, "median_us": 390.0}]}
    gate.write_baseline(actions.env["BASELINE"], faster, "faster")
    actions.outputs["submit"] = {"job_id": str(current)}  # the gate steps take a result.json as the ID too
    gated = actions.run(step["Gate against the baseline"])
    assert gated.returncode == 1 and "median_us(1) regression" in actions.summary.read_text()
    junit = actions.run(step["JUnit report"])  # the report step itself passes: the gate step already failed
    assert junit.returncode == 0, junit.stderr
    root = ET.parse(REPO / "gate-junit.xml").getroot()
    assert root.get("failures") == "1"


@pytest.fixture(autouse=True)
def no_stray_report(tmp_path_factory):
    """The workflow writes gate-junit.xml into the checkout: one test at a time has it (xdist runs this file's
    tests side by side, and each removes the file when it ends)."""
    lock = tmp_path_factory.getbasetemp().parent / "gate-junit.lock"  # shared by this run's workers
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield
        (REPO / "gate-junit.xml").unlink(missing_ok=True)
