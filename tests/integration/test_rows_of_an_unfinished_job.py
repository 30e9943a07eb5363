"""The rows a job printed before it failed or ran out of time can be had from `runner results`: they are the
`row` events of its log (the payload writes result.json only at its end, so a job cut short has none). Shown
with a line saying so and exit 1 (the job did not succeed); never recorded in the history or gated."""
from __future__ import annotations

import json

import pytest

from tests.cli_helpers import local_target, python_payload, run_cli, submit, wait_terminal, write_job

ROWS = """\
import json, sys, time
for n in (1, 4):
    print(json.dumps({"event": "row", "batch": n, "us_per_call": 10.0 * n, "t": 0.1}), flush=True)
print("not an event; then a row whose line is cut", flush=True)
print('{"event": "row", "batch": 16', flush=True)
"""


@pytest.mark.parametrize("ending, state", [("sys.exit(3)\n", "FAILED"), ("time.sleep(60)\n", "TIMED_OUT")])
def test_the_rows_a_failed_or_timed_out_job_printed_are_its_results(tmp_path, ending, state):
    target = local_target({"RUNNER_STATE_DIR": str(tmp_path / "state")})
    command = python_payload(target.root, "rows.py", ROWS + ending)
    job_id = submit(target, write_job(tmp_path / "j.yaml", target, command=command, max_runtime="3s", grace="1s"))
    assert wait_terminal(target, job_id)["state"] == state

    shown = run_cli(target, "results", job_id, timeout=60)
    assert shown.returncode == 1, shown.stderr
    assert f"ended {state} without a result".encode() in shown.stderr, shown.stderr
    assert b"2 rows its log holds" in shown.stderr, shown.stderr
    lines = shown.stdout.decode().splitlines()
    assert any(line.split() == ["1", "10", "1"] or line.split()[:2] == ["1", "10"] for line in lines), lines
    raw = run_cli(target, "results", job_id, "--json", timeout=60)
    assert raw.returncode == 1 and json.loads(raw.stdout)["rows"] == [
        {"batch": 1, "us_per_call": 10.0}, {"batch": 4, "us_per_call": 40.0}], raw.stdout
    listed = run_cli(target, "history", "--json", timeout=60)
    assert json.loads(listed.stdout) == [], listed.stdout  # a partial table is no run to compare against
    gated = run_cli(target, "results", job_id, "--save-baseline", str(tmp_path / "b.json"), timeout=60)
    assert gated.returncode == 1 and not (tmp_path / "b.json").exists(), gated.stderr
