"""runner.results.results: the text table and the lever plot of a result.json."""
import json
from pathlib import Path

import pytest

from runner.results.results import plot_lever, render_table

RUN = Path(__file__).resolve().parents[2] / "results" / "h200" / "run2"


def result(name: str) -> dict:
    return json.loads((RUN / f"{name}.json").read_text())


def synthetic() -> dict:
    rows = []
    for m, us, lever in ((1, 80.0, 1.0), (512, 3600.0, 11.4)):
        rows.append({"m": m, "median_us": us, "p10_us": us * 0.98, "p90_us": us * 1.05, "us_per_token": us / m,
                     "tokens_per_s": m / us * 1e6, "distinct_experts": 8.0 if m == 1 else 384.0,
                     "expert_gb_per_s": 2500.0, "copy_fraction": 0.6, "lever": lever,
                     "rep_levers": [lever * 0.99, lever, lever * 1.01], "lever_spread": 0.02})
    return {"environment": {"gpu": "NVIDIA H200", "torch": "2.11.0"}, "backend": {"used": "sglang-kernels", "why": "x"},
            "timing": {"used": "graph", "repeats": 3, "iterations": 100}, "rows": rows}


def test_table_has_a_line_per_batch_size_with_lever_and_spread():
    text = render_table(synthetic())
    lines = text.splitlines()
    header = next(line for line in lines if "median µs" in line)
    assert "lever" in header and "spread" in header
    row512 = next(line for line in lines if line.strip().startswith("512"))
    assert "11.40x" in row512 and "2.0%" in row512 and "60%" in row512 and "142,222" in row512


def test_table_of_a_real_h200_run_names_the_gpu_backend_jit_and_memory():
    text = render_table(result("cold"))
    assert "NVIDIA H200" in text and "sglang-kernels" in text
    assert "JIT cold" in text and "x weights" in text and "floor" in text
    assert len([line for line in text.splitlines() if line.strip()[:1].isdigit()]) >= 10


def test_table_of_a_failed_check_says_failed_per_batch_size():
    text = render_table(result("check_corrupt"))
    assert "check FAILED" in text
    assert text.count(" NO") == 4


def test_table_shows_a_payload_error():
    text = render_table({"error": "RuntimeError: no GPU", "environment": {"device": "cpu"}})
    assert "error: RuntimeError: no GPU" in text


def test_missing_values_render_as_dashes():
    res = synthetic()
    res["rows"][0]["copy_fraction"] = None
    first = next(line for line in render_table(res).splitlines() if line.strip().startswith("1 "))
    assert " - " in first


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = plot_lever(result("warm1"), tmp_path / "lever.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_refuses_a_result_without_rows(tmp_path):
    pytest.importorskip("matplotlib")
    from runner.errors import NoResult

    with pytest.raises(NoResult, match="no timing rows"):  # a RunnerError: a message and exit 1, no traceback
        plot_lever({"rows": []}, tmp_path / "x.png")


def test_any_other_payload_renders_scalars_and_row_lists():
    from runner.results.results import render_any

    text = render_any({"payload": "demo", "python": "3.12", "rows": [{"size": 1, "median_us": 84.2234}, {"size": 64, "median_us": 9495.5}]})
    assert "payload: demo" in text
    lines = text.splitlines()
    assert lines[lines.index("rows:") + 1].split() == ["size", "median_us"]
    assert lines[-1].split() == ["64", "9496"]


def demo_result() -> dict:
    """The shape remote_payload/payloads/demo/demo_payload.py writes."""
    return {"payload": "demo", "python": "3.11.2",
            "rows": [{"size": n, "median_us": 10.0 * n, "samples": 40 - n} for n in (1, 4, 16, 64)]}


def test_plot_of_the_demo_payload_draws_its_rows(tmp_path):
    pytest.importorskip("matplotlib")
    from runner.results.results import plot, plottable_series

    assert plottable_series(demo_result())[1:3] == ("size", ["median_us", "samples"])
    out = plot(demo_result(), tmp_path / "demo.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_rows_says_why_instead_of_a_traceback(tmp_path):
    from runner.errors import NoResult
    from runner.results.results import plot

    with pytest.raises(NoResult, match="nothing to plot"):
        plot({"payload": "x", "value": 3}, tmp_path / "x.png")
    with pytest.raises(NoResult, match="two numeric columns"):
        plot({"payload": "x", "rows": [{"name": "a"}, {"name": "b"}]}, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_plot_dispatches_marlin_results_to_the_lever_figure(tmp_path):
    pytest.importorskip("matplotlib")
    from runner.results.results import plot

    assert plot(synthetic(), tmp_path / "lever.png").stat().st_size > 10_000


def test_table_of_run4_shows_the_lever_interval_capped_windows_and_the_schedule():
    """`runner results` shows what the lever is worth: its bootstrap interval, how many windows ran
    under a power cap, and the window schedule it was measured with."""
    result = json.loads((Path(__file__).parents[2] / "results/h200/run4/il1.json").read_text())
    text = render_table(result)
    assert "windows: order interleave (seed 0) · settle busy 200 ms · 29 of 30 windows under a power/thermal cap" in text
    header, *rows = text.split("\n\n")[-1].splitlines()
    assert header.split()[-4:] == ["lever", "95%", "CI", "capped"]
    last = rows[-1].split()
    low, high = result["rows"][-1]["lever_ci95"]
    assert last[0] == "512" and last[-2] == f"{low:.2f}-{high:.2f}" and last[-1] == str(result["rows"][-1]["capped_windows"])


def test_only_time_like_columns_share_the_latency_axis():
    from runner.results.results import axis_groups

    assert axis_groups(["median_us", "samples", "p90_ms", "tokens_per_s", "us", "us_per_call"]) == [
        ["median_us", "p90_ms", "us", "us_per_call"], ["samples"], ["tokens_per_s"]]
    assert axis_groups(["samples", "tokens_per_s"]) == [["samples"], ["tokens_per_s"]]  # no time: each its own


def test_a_lever_plot_skips_rows_of_the_wrong_type(tmp_path):
    pytest.importorskip("matplotlib")
    from runner.results.results import plot

    res = synthetic()
    res["rows"].append({"m": "1024", "us_per_token": "fast", "lever": None})
    res["payload"] = "bench_marlin_moe"
    assert plot(res, tmp_path / "lever.png").stat().st_size > 10_000
