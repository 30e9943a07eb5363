"""The service's window (not serving, and its parts) reaches `runner results` and the results history, not
only `runner status`: the number a user of this tool pays for, beside the benchmark's own."""
from __future__ import annotations

import json

import pytest

from tests.cli_helpers import run_cli, submit, wait_terminal
from tests.harness.systemd_jobs import gpu_job, target_for
from tests.hosts._proc import shared_tmpdir

pytestmark = pytest.mark.systemd

WRITES_A_RESULT = ["sh", "-c", "printf '{\"rows\": [{\"size\": 1, \"median_us\": 5.0}]}' > \"$RUNNER_RESULT\""]


def test_results_and_history_carry_the_window(service_host):
    work = shared_tmpdir("runner-window-")
    target = target_for(service_host)
    job = wait_terminal(target, submit(target, gpu_job(work, service_host, stop="always", command=WRITES_A_RESULT)))
    assert job["state"] == "SUCCEEDED", job
    shown = run_cli(target, "results", job["job_id"])
    assert shown.returncode == 0, shown.stderr
    err = shown.stderr.decode()
    assert "service window (stop): not serving" in err and "payload" in err and "health" in err, err
    history = run_cli(target, "history", "--json", "--metric", "not_serving_s")
    assert history.returncode == 0, history.stderr
    runs = {r["job_id"]: r for r in json.loads(history.stdout)}
    metrics = runs[job["job_id"]]["metrics"]
    parts = job["service"]["downtime"]
    assert metrics["not_serving_s"]["value"] == pytest.approx(parts["not_serving_s"])
    assert metrics["not_serving_s"]["direction"] == "lower" and "health_s" in metrics
