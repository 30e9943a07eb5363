"""The regression gate and the plot on a benchmark of the user's own (columns batch, us_per_call, tokens_per_s),
its metrics declared in the job file's `metrics` section: a real job on the local transport, the CLI as a user
runs it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.cli_helpers import local_target, python_payload, run_cli, submit, wait_terminal, write_job

OWN = """\
import json, os, sys
slow = float(sys.argv[1])
rows = [{"batch": b, "us_per_call": 20.0 * b * slow, "tokens_per_s": 5e4 / b / slow, "samples": 9} for b in (1, 16)]
json.dump({"rows": rows}, open(os.environ["RUNNER_RESULT"], "w"))
"""
METRICS = {"key": "batch", "lower": ["us_per_call"], "higher": ["tokens_per_s"]}


def own_job(tmp_path: Path, target, slow: float, metrics: dict | None) -> str:
    command = python_payload(target.root, "own.py", OWN) + [str(slow)]
    job = write_job(tmp_path / f"own-{slow}.yaml", target, command=command)
    if metrics is not None:
        job.write_text(yaml.safe_dump({**yaml.safe_load(job.read_text()), "metrics": metrics}, sort_keys=False))
    job_id = submit(target, job)
    assert wait_terminal(target, job_id)["state"] == "SUCCEEDED"
    return job_id


def test_a_job_declaring_its_metrics_is_baselined_gated_compared_and_recorded(tmp_path):
    target = local_target({"RUNNER_STATE_DIR": str(tmp_path / "state")})
    base, slow = own_job(tmp_path, target, 1.0, METRICS), own_job(tmp_path, target, 1.25, METRICS)
    saved = run_cli(target, "results", base, "--save-baseline", str(tmp_path / "b.json"))
    assert saved.returncode == 0 and b"4 metrics" in saved.stderr, saved.stderr
    directions = {n: m["direction"] for n, m in json.loads((tmp_path / "b.json").read_text())["metrics"].items()}
    assert directions == {"us_per_call_1": "lower", "tokens_per_s_1": "higher", "us_per_call_16": "lower",
                          "tokens_per_s_16": "higher"}
    gated = run_cli(target, "results", slow, "--baseline", str(tmp_path / "b.json"))
    summary = gated.stdout.decode().splitlines()[0]
    assert gated.returncode == 1 and "us_per_call(1) regression" in summary and "tokens_per_s(16) regression" in summary
    compared = run_cli(target, "results", base, "--compare", slow)
    assert compared.returncode == 0 and b"tokens_per_s(1)" in compared.stdout, compared.stderr
    history = json.loads(run_cli(target, "history", "--json").stdout)
    assert {"us_per_call_16", "tokens_per_s_16"} <= set(history[0]["metrics"]), history


def test_without_a_declaration_baseline_and_compare_say_what_to_declare(tmp_path):
    target = local_target({"RUNNER_STATE_DIR": str(tmp_path / "state")})
    job_id = own_job(tmp_path, target, 1.0, None)
    saved = run_cli(target, "results", job_id, "--save-baseline", str(tmp_path / "b.json"))
    assert saved.returncode == 2 and b"metrics: {key: " in saved.stderr, saved.stderr
    compared = run_cli(target, "results", job_id, "--compare", job_id)
    assert compared.returncode == 2 and b"nothing to compare" in compared.stderr and not compared.stdout.strip()


def test_a_bad_metrics_section_names_the_field(tmp_path):
    target = local_target({"RUNNER_STATE_DIR": str(tmp_path / "state")})
    for metrics, field in (({"key": "batch"}, "metrics"), ({"key": "batch", "lower": ["a"], "higher": ["a"]}, "metrics"),
                           ({"key": "batch", "lower": ["a b"]}, "metrics.lower.0"), ({"lower": ["a"]}, "metrics.key")):
        job = write_job(tmp_path / "bad.yaml", target, command=["true"])
        job.write_text(yaml.safe_dump({**yaml.safe_load(job.read_text()), "metrics": metrics}))
        done = run_cli(target, "submit", str(job), "--dry-run")
        assert done.returncode == 2 and f"{job}: {field}".encode() in done.stderr, (metrics, done.stderr)


def test_the_plot_draws_every_numeric_column_a_count_on_an_axis_of_its_own(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from runner.results import results

    drawn = {}

    def keep(fig, path):
        drawn["axes"] = [([line.get_label() for line in ax.get_lines()], ax.get_ylabel()) for ax in fig.axes]
        return Path(path)

    monkeypatch.setattr(results, "save_figure", keep)
    rows = [{"batch": b, "us_per_call": 20.0 * b, "p90_us": 25.0 * b, "tokens_per_s": 5e4 / b, "samples": 9}
            for b in (1, 16)]
    results.plot({"rows": rows}, tmp_path / "own.png")
    drawn_columns = sorted(label for labels, _ in drawn["axes"] for label in labels)
    assert drawn_columns == ["p90_us", "samples", "tokens_per_s", "us_per_call"], drawn
    for labels, ylabel in drawn["axes"]:
        assert ylabel == ", ".join(labels), drawn  # each axis says what it draws
    assert ["samples"] in [labels for labels, _ in drawn["axes"]]  # a count shares no axis with a time
