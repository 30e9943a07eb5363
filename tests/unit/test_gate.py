"""runner.results.gate and runner.results.gate_report: metrics from real H200 results, verdicts, the baseline
file, the formats.

The CLI cases run `python -m runner results` as a user or CI step would (a result.json path as the ID,
so no host is needed).
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from runner.errors import BadBaseline
from runner.results import gate, gate_report

REPO = Path(__file__).resolve().parents[2]
RUN2 = REPO / "results" / "h200" / "run2"


def result(name: str) -> dict:
    return json.loads((RUN2 / f"{name}.json").read_text())


def slowed(res: dict, m: int, factor: float) -> dict:
    """A copy of `res` whose batch size m is `factor` times slower: medians up, lever down by the same factor."""
    res = copy.deepcopy(res)
    row = next(r for r in res["rows"] if r["m"] == m)
    for key in ("median_us", "p10_us", "p90_us", "us_per_token"):
        row[key] *= factor
    row["rep_median_us"] = [v * factor for v in row["rep_median_us"]]
    row["lever"] /= factor
    row["rep_levers"] = [v / factor for v in row["rep_levers"]]
    entry = res["lever"]["by_m"][str(m)]
    for key in ("lever", "min", "max"):
        entry[key] /= factor
    return res


def runner(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=60)


def save(path: Path, res: dict) -> Path:
    path.write_text(json.dumps(res))
    return path


# -- metrics ------------------------------------------------------------------------------------------------

def test_metrics_of_a_marlin_result_have_direction_and_measured_spread():
    res = result("warm1")
    metrics = gate.extract_metrics(res)
    sizes = [r["m"] for r in res["rows"]]
    assert {f"median_us_{m}" for m in sizes} <= set(metrics)
    assert {f"lever_{m}" for m in sizes if m != 1} <= set(metrics) and "lever_1" not in metrics
    assert metrics["median_us_512"].direction == "lower" and metrics["lever_512"].direction == "higher"
    entry = res["lever"]["by_m"]["512"]
    assert metrics["lever_512"].spread == pytest.approx((entry["max"] - entry["min"]) / 2 / entry["lever"])
    reps = res["rows"][-1]["rep_median_us"]
    assert metrics["median_us_512"].spread == pytest.approx((max(reps) - min(reps)) / 2 / res["rows"][-1]["median_us"])
    assert metrics["peak_over_weights"] == gate.Metric(res["memory"]["peak_over_weights"], "lower", 0.0)


def test_a_bootstrap_interval_is_preferred_to_min_max():
    res = result("warm1")
    res["lever"]["by_m"]["512"].update(ci_low=11.0, ci_high=11.8)
    assert gate.extract_metrics(res)["lever_512"].spread == pytest.approx(0.4 / res["lever"]["by_m"]["512"]["lever"])


def test_the_demo_payloads_rows_are_gated_by_size():
    demo = {"payload": "demo", "rows": [{"size": 1, "median_us": 10.0, "samples": 9}, {"size": 64, "median_us": 640.0}]}
    assert gate.extract_metrics(demo) == {"median_us_1": gate.Metric(10.0, "lower"), "median_us_64": gate.Metric(640.0, "lower")}


def test_labels_name_the_batch_size():
    assert gate.label("lever_512") == "lever(512)" and gate.label("peak_over_weights") == "peak_over_weights"


# -- verdicts -----------------------------------------------------------------------------------------------

def test_two_warm_h200_runs_are_within():
    base = gate.extract_metrics(result("warm1"))
    verdicts = gate.compare(base, gate.extract_metrics(result("warm2")), 0.05)
    assert len(verdicts) == len(base) and {v.verdict for v in verdicts} == {"within"}
    assert gate.exit_code(verdicts) == 0


def test_a_ten_percent_slowdown_at_512_is_a_regression_of_lever_512_only():
    base = gate.extract_metrics(result("warm1"))
    verdicts = {v.name: v for v in gate.compare(base, gate.extract_metrics(slowed(result("warm2"), 512, 1.10)), 0.05)}
    assert {n for n, v in verdicts.items() if v.failed} == {"lever_512", "median_us_512"}
    assert verdicts["lever_512"].verdict == "regression" and verdicts["lever_512"].change > verdicts["lever_512"].allowed
    assert gate.exit_code(list(verdicts.values())) == 1


def test_direction_decides_improved_and_regression():
    lower, higher = gate.Metric(100.0, "lower", 0.01), gate.Metric(10.0, "higher", 0.01)
    assert gate.judge("t", lower, gate.Metric(80.0, "lower"), 0.05).verdict == "improved"
    assert gate.judge("t", lower, gate.Metric(120.0, "lower"), 0.05).verdict == "regression"
    assert gate.judge("l", higher, gate.Metric(12.0, "higher"), 0.05).verdict == "improved"
    assert gate.judge("l", higher, gate.Metric(8.0, "higher"), 0.05).verdict == "regression"
    # the larger of the two measured spreads widens the allowance: 10% worse, ±6% spread + 5% → within
    assert gate.judge("t", lower, gate.Metric(110.0, "lower", 0.06), 0.05).verdict == "within"


def test_a_metric_missing_from_the_result_fails_and_a_new_one_does_not():
    verdicts = gate.compare({"lever_1024": gate.Metric(20.0, "higher")}, {"lever_2": gate.Metric(1.2, "higher")}, 0.05)
    assert [(v.name, v.verdict) for v in verdicts] == [("lever_1024", "missing"), ("lever_2", "new")]
    assert gate.exit_code(verdicts) == 1


@pytest.mark.parametrize("text, value", [("5%", 0.05), ("0.05", 0.05), (" 12.5% ", 0.125), ("0", 0.0)])
def test_tolerance_as_percent_or_fraction(text, value):
    assert gate.parse_tolerance(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["abc", "-5%", "nan", "5%%", ""])
def test_bad_tolerance_says_what_is_allowed(text):
    with pytest.raises(ValueError, match="tolerance"):
        gate.parse_tolerance(text)


# -- the baseline file ----------------------------------------------------------------------------------------

def test_a_saved_baseline_reads_back_as_the_same_metrics(tmp_path):
    document = gate.write_baseline(tmp_path / "b.json", result("warm1"), "warm1")
    assert document["schema"] == 1 and document["kind"] == "runner-baseline"
    assert document["environment"]["gpu"] == "NVIDIA H200"
    assert gate.read_baseline(tmp_path / "b.json") == gate.extract_metrics(result("warm1"))


def good_baseline() -> dict:
    return gate.baseline_document(result("warm1"), "warm1")


@pytest.mark.parametrize("mutate, message", [
    (lambda d: "{not json", "not JSON"),
    (lambda d: [1, 2], "a baseline is a JSON object"),
    (lambda d: {**d, "kind": "something-else"}, "kind: expected 'runner-baseline'"),
    (lambda d: {**d, "schema": 2}, "schema: this runner reads schema 1, got 2"),
    (lambda d: {**d, "metrics": {}}, "metrics: expected a non-empty object"),
    (lambda d: {**d, "metrics": {"lever_512": {"value": 11.4, "direction": "up"}}}, "metrics.lever_512.direction"),
    (lambda d: {**d, "metrics": {"lever_512": {"value": -1, "direction": "higher"}}}, "metrics.lever_512.value"),
    (lambda d: {**d, "metrics": {"lever_512": {"value": 1, "direction": "higher", "spread": "3%"}}}, "metrics.lever_512.spread"),
    (lambda d: {**d, "metrics": {"lever_512": 11.4}}, "metrics.lever_512: expected an object"),
])
def test_a_bad_baseline_is_refused_naming_what_is_wrong(tmp_path, mutate, message):
    changed = mutate(good_baseline())
    path = tmp_path / "bad baseline; 'quoted'.json"
    path.write_text(changed if isinstance(changed, str) else json.dumps(changed))
    with pytest.raises(BadBaseline, match=message) as info:
        gate.read_baseline(path)
    assert str(path) in str(info.value) and info.value.exit_code == 2


def test_a_result_without_metrics_writes_no_baseline(tmp_path):
    with pytest.raises(BadBaseline, match="no gateable metrics"):
        gate.write_baseline(tmp_path / "b.json", {"payload": "x", "value": 3}, "x")
    assert not (tmp_path / "b.json").exists()


# -- formats ------------------------------------------------------------------------------------------------

def verdicts_with_regression() -> list[gate.Verdict]:
    base = gate.extract_metrics(result("warm1"))
    return gate.compare(base, gate.extract_metrics(slowed(result("warm2"), 512, 1.10)), 0.05)


def test_junit_has_one_testcase_per_metric_and_a_failure_for_each_regression():
    verdicts = verdicts_with_regression()
    root = ET.fromstring(gate_report.render(verdicts, "junit", baseline="b.json", current="r.json", tolerance=0.05))
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == len(verdicts) and root.get("failures") == "2"
    failed = {c.get("name"): c.find("failure") for c in cases if c.find("failure") is not None}
    assert set(failed) == {"lever(512)", "median_us(512)"}
    assert failed["lever(512)"].get("type") == "regression" and "+9.1%" in failed["lever(512)"].get("message")


def test_markdown_is_a_table_with_the_failed_verdicts_in_bold():
    verdicts = verdicts_with_regression()
    text = gate_report.render(verdicts, "markdown", baseline="b.json", current="r.json", tolerance=0.05)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    summary = next(line for line in text.splitlines() if line.startswith("gate "))
    assert len(rows) == len(verdicts) + 1 and "FAILED: " in summary and "lever(512) regression" in summary
    assert next(r for r in rows if r.startswith("| lever(512) ")).endswith("| **REGRESSION** |")


def test_hostile_metric_names_stay_inside_their_cell_and_element():
    name = 'a|b <x> & "q"\nnext'
    verdicts = gate.compare({name: gate.Metric(1.0, "lower")}, {name: gate.Metric(2.0, "lower")}, 0.05)
    markdown = gate_report.render(verdicts, "markdown", baseline="b", current="c", tolerance=0.05)
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert len(rows) == 2 and rows[1].startswith("| a\\|b <x> & \"q\" next |")
    case = ET.fromstring(gate_report.render(verdicts, "junit", baseline="b", current="c", tolerance=0.05)).find(".//testcase")
    assert case.get("name") == name and case.find("failure").get("type") == "regression"


# -- through the CLI ---------------------------------------------------------------------------------------------

def test_cli_gate_warm2_against_warm1_passes(tmp_path):
    done = runner("results", "--save-baseline", str(tmp_path / "base.json"), str(RUN2 / "warm1.json"))
    assert done.returncode == 0, done.stderr
    done = runner("results", str(RUN2 / "warm2.json"), "--baseline", str(tmp_path / "base.json"), "--tolerance", "5%")
    assert done.returncode == 0, done.stderr
    assert "PASSED, 20 metrics" in done.stdout and "REGRESSION" not in done.stdout


def test_cli_gate_of_a_slowed_512_exits_1_naming_lever_512(tmp_path):
    gate.write_baseline(tmp_path / "base.json", result("warm1"), "warm1")
    slow = save(tmp_path / "slow.json", slowed(result("warm2"), 512, 1.10))
    done = runner("results", str(slow), "--baseline", str(tmp_path / "base.json"))
    assert done.returncode == 1, done.stderr
    summary = done.stdout.splitlines()[0]
    assert "FAILED: " in summary and "lever(512) regression" in summary and "median_us(512) regression" in summary
    junit = runner("results", str(slow), "--baseline", str(tmp_path / "base.json"), "--format", "junit")
    assert junit.returncode == 1 and ET.fromstring(junit.stdout).get("failures") == "2"


def test_cli_bad_baseline_exits_2_with_the_field(tmp_path):
    (tmp_path / "base.json").write_text(json.dumps({**good_baseline(), "schema": 7}))
    done = runner("results", str(RUN2 / "warm2.json"), "--baseline", str(tmp_path / "base.json"))
    assert done.returncode == 2 and "schema: this runner reads schema 1, got 7" in done.stderr and not done.stdout


def test_cli_bad_tolerance_is_a_usage_error():
    done = runner("results", str(RUN2 / "warm2.json"), "--baseline", "x.json", "--tolerance", "five")
    assert done.returncode == 2 and "not a tolerance" in done.stderr


def test_cli_compare_shows_two_runs_side_by_side():
    done = runner("results", str(RUN2 / "warm1.json"), "--compare", str(REPO / "results/h200/run1/warm1.json"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("A: ") and "sglang 0.5.17" in lines[0] and "sglang unknown" in lines[1]
    assert next(line for line in lines if line.startswith("lever(512)")).split()[1:3] == ["11.45", "±3.0%"]


def test_metrics_of_fields_of_the_wrong_type_are_left_out():
    assert gate.extract_metrics([{"m": 1, "median_us": 5.0}]) == {}
    odd = {"rows": [{"m": True, "median_us": 5.0}, {"m": 2, "median_us": 3.0, "rep_median_us": 7}, "x"],
           "lever": {"by_m": ["x"]}, "memory": [1]}
    assert gate.extract_metrics(odd) == {"median_us_2": gate.Metric(3.0, "lower", 0.0)}


def test_a_baseline_written_into_a_missing_directory_names_the_path(tmp_path):
    from runner.errors import SpecError

    with pytest.raises(SpecError, match="missing/b.json: cannot write a baseline: No such file"):
        gate.write_baseline(tmp_path / "missing" / "b.json", result("warm1"), "warm1")


# -- a benchmark of the user's own: its metrics declared ---------------------------------------------------------

OWN_ROWS = [{"batch": b, "us_per_call": 20.0 * b, "tokens_per_s": 5e4 / b, "samples": 9} for b in (1, 16)]
DECLARED = {"key": "batch", "lower": ["us_per_call"], "higher": ["tokens_per_s"]}


def test_declared_columns_are_metrics_keyed_by_the_declared_column():
    assert gate.extract_metrics({"rows": OWN_ROWS}) == {}  # nothing declared: no guess at what is better
    declared = gate.extract_metrics({"rows": OWN_ROWS}, DECLARED)
    assert declared == {"us_per_call_1": gate.Metric(20.0, "lower"), "tokens_per_s_1": gate.Metric(5e4, "higher"),
                        "us_per_call_16": gate.Metric(320.0, "lower"), "tokens_per_s_16": gate.Metric(3125.0, "higher")}
    assert gate.extract_metrics({"rows": OWN_ROWS, "metrics": DECLARED}) == declared  # the result's own
    assert gate_report.label("tokens_per_s_16") == "tokens_per_s(16)"


def test_a_declared_columns_repetitions_give_its_spread():
    rows = [{"batch": 4, "us_per_call": 10.0, "rep_us_per_call": [9.0, 11.0]}]
    assert gate.extract_metrics({"rows": rows}, DECLARED)["us_per_call_4"] == gate.Metric(10.0, "lower", 0.1)


def test_a_results_own_metrics_field_of_another_shape_is_its_data_not_a_declaration():
    for own in ({"accuracy": 0.9}, {"key": 3, "lower": ["us_per_call"]}, {"key": "batch", "lower": "us_per_call"},
                {"key": "batch"}, ["batch"]):
        assert gate.extract_metrics({"rows": OWN_ROWS, "metrics": own}) == {}, own


def test_a_result_without_metrics_says_how_to_declare_them(tmp_path):
    with pytest.raises(BadBaseline, match="no gateable metrics") as caught:
        gate.write_baseline(tmp_path / "b.json", {"rows": OWN_ROWS}, "own.json")
    assert "metrics: {key: " in caught.value.hint


def test_cli_baseline_and_compare_of_a_result_declaring_its_own_metrics(tmp_path):
    base = save(tmp_path / "base.json", {"rows": OWN_ROWS, "metrics": DECLARED})
    slow_rows = [dict(r, us_per_call=r["us_per_call"] * 1.2) for r in OWN_ROWS]
    slow = save(tmp_path / "slow.json", {"rows": slow_rows, "metrics": DECLARED})
    done = runner("results", str(base), "--save-baseline", str(tmp_path / "b.json"))
    assert done.returncode == 0 and "4 metrics" in done.stderr, done.stderr
    gated = runner("results", str(slow), "--baseline", str(tmp_path / "b.json"))
    assert gated.returncode == 1 and "us_per_call(16) regression" in gated.stdout.splitlines()[0], gated.stdout
    compared = runner("results", str(base), "--compare", str(slow))
    assert compared.returncode == 0 and "us_per_call(1)" in compared.stdout and "tokens_per_s(16)" in compared.stdout


def test_cli_an_empty_comparison_is_an_error_not_an_empty_table(tmp_path):
    a = save(tmp_path / "a.json", {"rows": OWN_ROWS})
    done = runner("results", str(a), "--compare", str(a))
    assert done.returncode == 2 and "nothing to compare" in done.stderr and "metrics: {key: " in done.stderr
    assert "metric" not in done.stdout, done.stdout
