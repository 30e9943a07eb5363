"""`runner results` and `runner history` against whatever a payload wrote: any JSON shape, NaN, huge files,
FIFOs, a missing optional extra, a job still running, a job id that looks like a file name.

The renderers are called directly over a table of shapes (and arbitrary JSON, with hypothesis); the CLI cases
run `python -m runner` against a real job on the local transport whose result.json is then replaced.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.deadline import Deadline
from runner.commands import unattended
from runner.errors import NoResult, RunnerError, UnknownJob
from runner.results import gate, gate_report, history, history_report, results
from runner.results.fleet_results import side_by_side
from runner.state.store import Store
from tests.cli_helpers import REPO, Target, run_cli, submit, wait_terminal, write_job
from tests.hosts._proc import shared_tmpdir

# What payloads have written, or could: every one must be fetchable raw and render without a traceback.
SHAPES = {
    "list": "[]",
    "list of rows": '[{"m": 1, "median_us": 5.0}]',
    "string": '"done"',
    "null": "null",
    "int": "3",
    "float": "1.5",
    "bool": "true",
    "empty object": "{}",
    "rows a string": '{"rows": "abc"}',
    "rows a number": '{"rows": 5}',
    "rows not dicts": '{"rows": [1, "x", null, [2]]}',
    "rows of strings": '{"rows": [{"m": "x", "median_us": "fast", "size": []}]}',
    "rows an object": '{"lever": "x", "memory": [], "rows": {"m": 1}}',
    "marlin wrong rows": '{"payload": "bench_marlin_moe", "rows": [{"m": "1", "median_us": "x", "lever_ci95": 3}]}',
    "marlin wrong sections": '{"payload": "bench_marlin_moe", "environment": "h200", "backend": [1], '
                             '"jit": {"state": "cold", "first_call_s": "slow"}, "memory": {"peak_allocated_bytes": "x"},'
                             ' "timing": {"order": "x", "settle": 3}, "floor": {"m": "x"}, "copy_bandwidth": 5}',
    "marlin check wrong": '{"payload": "bench_marlin_moe", "check": {"rows": [{"m": 1}, 7], "passed": "yes"}}',
    "sweep variants a string": '{"payload": "sweep", "variants": "x", "sweep": []}',
    "sweep variants wrong": '{"payload": "sweep", "variants": [1, {"result": "x", "args": []}, '
                            '{"result": {"rows": [5]}, "columns": 3}, {"status": "skipped"}]}',
    "lever wrong": '{"lever": {"by_m": {"512": "x", "1": {"lever": "y"}, "2": {"lever": 2, "ci_low": "a"}}, '
                   '"base_m": []}, "memory": {"peak_over_weights": "x"}}',
    "args and environment wrong": '{"args": "x", "environment": [1], "payload": {"a": 1}}',
    "non-finite numbers": '{"payload": "demo", "rows": [{"size": 1, "median_us": NaN}, {"size": 2, '
                          '"median_us": Infinity}, {"size": 4, "median_us": -Infinity}]}',
    "payload a list": '{"payload": ["bench_marlin_moe"], "rows": [{"size": 1, "median_us": 2}]}',
}


def parsed(text: str):
    return json.loads(text)


def strict_loads(text):
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def finite(value):
    """`value` with every NaN/Infinity as None: what `--json` prints."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [finite(v) for v in value]
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    return value


# -- the renderers, directly ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SHAPES)
def test_every_shape_renders_gates_and_records_without_raising(name, tmp_path):
    value = parsed(SHAPES[name])
    text = results.render_any(value)
    assert isinstance(text, str) and text.endswith("\n")
    assert isinstance(gate.extract_metrics(value), dict)
    verdicts = gate.compare(gate.extract_metrics(parsed(SHAPES["list of rows"])), gate.extract_metrics(value), 0.05)
    assert gate_report.side_by_side(value, {"rows": []}, verdicts, name_a="a", name_b="b")
    assert gate_report.render(verdicts, "text", baseline="b.json", current="a", tolerance=0.05)
    run = history.run_from_result("j", value)
    assert history.record(history.db_path(tmp_path), run) is None
    assert history_report.render(history.runs(history.db_path(tmp_path)), None)
    assert isinstance(side_by_side({"a": value, "b": {"rows": []}}, {}), str)


@pytest.mark.parametrize("name", SHAPES)
def test_every_shape_plots_or_says_why(name, tmp_path):
    pytest.importorskip("matplotlib")
    try:
        out = results.plot(parsed(SHAPES[name]), tmp_path / "p.png")
    except NoResult as exc:
        assert "nothing to plot" in str(exc)
    else:
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


KEYS = st.sampled_from(["rows", "m", "size", "median_us", "payload", "lever", "by_m", "base_m", "environment",
                        "memory", "timing", "order", "settle", "check", "variants", "result", "args", "sweep",
                        "jit", "floor", "copy_bandwidth", "error", "status", "index", "columns", "gpu", "1", "512"])
SCALARS = (st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=True)
           | st.sampled_from(["bench_marlin_moe", "sweep", "demo", "skipped", "", "x" * 300]))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS | st.text(max_size=5),
                                                                                          inner, max_size=6),
                    max_leaves=40)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_arbitrary_json_renders_and_extracts_without_raising(value):
    assert isinstance(results.render_any(value), str)
    assert isinstance(gate.extract_metrics(value), dict)
    history.run_from_result("j", value)
    strict_loads(json.dumps(results.strict_json(value)))


def test_demo_plot_keeps_a_count_off_the_latency_axis(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    drawn = {}

    def keep(fig, path):
        drawn["axes"] = [([line.get_label() for line in ax.get_lines()], ax.get_ylabel()) for ax in fig.axes]
        return Path(path)

    monkeypatch.setattr(results, "save_figure", keep)
    demo = {"payload": "demo", "rows": [{"size": n, "median_us": 10.0 * n, "samples": 40 - n} for n in (1, 4, 16)]}
    results.plot(demo, tmp_path / "demo.png")
    assert drawn["axes"] == [(["median_us"], "median_us"), (["samples"], "samples")]  # drawn, on an axis of its own


# -- the CLI, against a real job on the local transport ----------------------------------------------------------

@pytest.fixture(scope="module")
def ended_job():
    """One ended job on the local host; each test replaces its result.json. (target, job id, result path)"""
    root = shared_tmpdir("runner-root-")
    state = shared_tmpdir("runner-state-")
    target = Target("local", {"address": "local", "root": str(root)}, root, {"RUNNER_STATE_DIR": str(state)})
    job_id = submit(target, write_job(root / "j.yaml", target, command=["true"]))
    wait_terminal(target, job_id)
    return target, job_id, root / "jobs" / job_id / "result.json"


def no_traceback(done: subprocess.CompletedProcess) -> None:
    assert b"Traceback" not in done.stderr and b"Traceback" not in done.stdout, done.stderr.decode()[-2000:]


@pytest.mark.parametrize("name", SHAPES)
def test_cli_results_fetches_any_shape_raw_and_renders_it(ended_job, name):
    target, job_id, path = ended_job
    path.write_text(SHAPES[name])
    raw = run_cli(target, "results", job_id, "--json", timeout=60)
    no_traceback(raw)
    assert raw.returncode == 0, raw.stderr
    assert strict_loads(raw.stdout) == finite(parsed(SHAPES[name]))
    table = run_cli(target, "results", job_id, timeout=60)
    no_traceback(table)
    assert table.returncode == 0, table.stderr
    listed = run_cli(target, "history", timeout=60)
    no_traceback(listed)
    assert listed.returncode == 0 and job_id.encode() in listed.stdout, listed.stderr


def test_cli_results_json_of_non_finite_numbers_is_strict_json_and_says_so(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(SHAPES["non-finite numbers"])
    done = subprocess.run([sys.executable, "-m", "runner", "results", str(path), "--json"], capture_output=True,
                          text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [r["median_us"] for r in strict_loads(done.stdout)["rows"]] == [None, None, None]
    assert "null" in done.stderr and "NaN" in done.stderr


def runner(*args: str, timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout, **kw)


def test_a_result_over_the_cap_is_refused_quickly_naming_the_cap(tmp_path, ended_job):
    big = tmp_path / "big.json"
    big.write_text('{"rows": [' + ",".join(['{"size": 1, "median_us": 2.0}'] * 1_400_000) + "]}")
    assert big.stat().st_size > results.MAX_RESULT_BYTES
    for ref in (str(big),):
        started = time.monotonic()
        done = runner("results", ref, "--json", timeout=60)
        assert done.returncode == 1 and "32 MB" in done.stdout + done.stderr, done.stderr
        assert time.monotonic() - started < 20
    target, job_id, path = ended_job
    path.write_bytes(big.read_bytes())
    done = run_cli(target, "results", job_id, timeout=60)
    no_traceback(done)
    assert done.returncode == 1 and b"32 MB" in done.stderr and str(path).encode() in done.stderr, done.stderr


def test_one_huge_line_in_a_result_keeps_the_table_bounded(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"payload": "demo", "note": "x" * 30_000_000,
                                "rows": [{"size": 1, "median_us": 2.0, "label": "y" * 1_000_000}]}))
    done = runner("results", str(path), timeout=60)
    assert done.returncode == 0, done.stderr[-500:]
    assert len(done.stdout) < 100_000 and "note: xxx" in done.stdout


@pytest.mark.parametrize("args", [
    ["results", "{fifo}"],
    ["results", "{good}", "--baseline", "{fifo}"],
    ["results", "{good}", "--save-baseline", "{fifo}"],
    ["results", "{good}", "--plot", "{fifo}"],
    ["history", "--import", "{fifo}"],
], ids=["result", "baseline", "save-baseline", "plot", "history-import"])
def test_a_fifo_as_any_path_is_refused_not_waited_on(tmp_path, args):
    fifo = tmp_path / "pipe.png"  # a name every option accepts: only its kind is wrong
    os.mkfifo(fifo)
    good = REPO / "results" / "h200" / "run2" / "warm1.json"
    argv = [a.format(fifo=fifo, good=good) for a in args]
    try:
        done = runner(*argv, timeout=20, env={**os.environ, "MPLBACKEND": "Agg"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"runner {' '.join(argv)} blocked on a FIFO")
    assert done.returncode == 2 and "not a regular file" in done.stderr and str(fifo) in done.stderr, done.stderr


def without(modules: list[str], *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The CLI as if `modules` were not installed (an import of them raises ModuleNotFoundError)."""
    code = (f"import sys; sys.modules.update(dict.fromkeys({modules!r})); sys.argv = ['runner', *{list(argv)!r}]; "
            "from runner.cli.cli import main; main()")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=timeout)


def test_plot_without_the_plot_extra_names_it(tmp_path):
    good = str(REPO / "results" / "h200" / "run2" / "warm1.json")
    for argv in (["results", good, "--plot", str(tmp_path / "a.png")],
                 ["history", "--import", good, "--plot", str(tmp_path / "b.png")]):
        done = without(["matplotlib", "matplotlib.pyplot"], *argv)
        assert "Traceback" not in done.stderr, done.stderr
        assert done.returncode == 2 and "pip install 'runner[plot]'" in done.stderr, done.stderr


def test_mcp_without_the_mcp_extra_names_it():
    for missing in (["anyio"], ["mcp"]):
        done = without(missing, "mcp")
        assert "Traceback" not in done.stderr, done.stderr
        assert done.returncode == 2 and "pip install 'runner[mcp]'" in done.stderr, done.stderr


def test_save_baseline_into_a_missing_directory_names_the_path(tmp_path):
    target = tmp_path / "missing" / "dir" / "b.json"
    done = runner("results", str(REPO / "results" / "h200" / "run2" / "warm1.json"), "--save-baseline", str(target))
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2 and str(target) in done.stderr, done.stderr


def test_results_of_a_running_job_is_75_call_again(tmp_path):
    root = shared_tmpdir("runner-root-")
    target = Target("local", {"address": "local", "root": str(root)}, root,
                    {"RUNNER_STATE_DIR": str(tmp_path / "state")})
    job_id = submit(target, write_job(root / "sleep.yaml", target, command=["sleep", "30"]))
    try:
        done = run_cli(target, "results", job_id)
        no_traceback(done)
        assert done.returncode == 75 and b"still" in done.stderr and b"call again" in done.stderr, done.stderr
        as_json = json.loads(run_cli(target, "results", job_id, "--json").stdout)
        assert as_json["exit"] == 75 and as_json["error"] != "RemoteError", as_json
    finally:
        run_cli(target, "cancel", job_id)
        wait_terminal(target, job_id)
    ended = run_cli(target, "results", job_id)
    assert ended.returncode == 1 and b"without a result" in ended.stderr, ended.stderr


def test_a_job_id_ending_in_json_is_a_job_id_and_a_path_needs_a_slash_or_to_exist(tmp_path, ended_job):
    target, _, _ = ended_job
    job_file = write_job(tmp_path / "j.yaml", target, command=["true"])
    job_id = submit(target, job_file, "--job-id", "run-7.json")
    wait_terminal(target, job_id)
    (target.root / "jobs" / job_id / "result.json").write_text('{"payload": "demo", "from": "the job"}')
    work = tmp_path / "cwd"
    work.mkdir()
    (work / "run-7.json").write_text('{"from": "the file"}')
    (work / "other.json").write_text('{"from": "other"}')

    def fetch(ref):
        done = subprocess.run([sys.executable, "-m", "runner", "results", ref, "--json"], capture_output=True,
                              text=True, cwd=work, timeout=60, env={**os.environ, **target.env,
                                                                    "PYTHONPATH": str(REPO)})
        return done.returncode, json.loads(done.stdout)

    assert fetch("run-7.json") == (0, {"payload": "demo", "from": "the job"})  # a known job id wins
    assert fetch("./run-7.json") == (0, {"from": "the file"})  # a slash makes it a path
    assert fetch("other.json") == (0, {"from": "other"})  # an existing file that is no job id
    code, answer = fetch("nosuch.json")
    assert code == 2 and "neither a file nor a job id" in answer["message"], answer


def test_collect_rule_in_process(tmp_path, monkeypatch):
    """The same rule, without a host: a path when it has a slash or exists and is no known job id."""
    store = Store(tmp_path / "state")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.json").write_text('{"a": 1}')
    assert unattended.collect("r.json", store=store, deadline=Deadline.for_command(5)).result == {"a": 1}
    assert unattended.collect(str(tmp_path / "r.json"), store=store, deadline=Deadline.for_command(5)).result == {"a": 1}
    with pytest.raises(UnknownJob, match="neither a file nor a job id"):
        unattended.collect("gone.json", store=store, deadline=Deadline.for_command(5))
    with pytest.raises(RunnerError, match="No such file"):
        unattended.collect("./gone.json", store=store, deadline=Deadline.for_command(5))


@pytest.mark.parametrize("ref", ["'; rm -rf /'", "./gone.json", "no/such/dir/result.json"])
def test_a_path_to_no_file_is_exit_2_like_an_unknown_id(tmp_path, ref):
    """A reference that names nothing is a usage error (2) whether it looks like a path or an id; 1 is kept
    for a job or file that exists and holds no result."""
    done = runner("results", ref, env={**os.environ, "RUNNER_STATE_DIR": str(tmp_path / "state")})
    assert done.returncode == 2 and "No such file" in done.stderr, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr


# -- history ------------------------------------------------------------------------------------------------

def demo_file(directory: Path, name: str, scale: float) -> str:
    path = directory / name
    path.write_text(json.dumps({"payload": "demo", "rows": [{"size": n, "median_us": scale * n, "samples": 9}
                                                            for n in (1, 4)]}))
    return str(path)


def test_history_unknown_metric_is_exit_2_naming_the_known_ones(tmp_path):
    env = {**os.environ, "RUNNER_STATE_DIR": str(tmp_path / "state")}
    done = runner("history", "--import", demo_file(tmp_path, "a.json", 1.0), "--metric", "nosuch", env=env)
    assert done.returncode == 2 and "nosuch" in done.stderr and "median_us_1, median_us_4" in done.stderr, done.stderr


def test_history_plot_of_two_demo_runs_plots_a_metric_they_have(tmp_path):
    pytest.importorskip("matplotlib")
    env = {**os.environ, "RUNNER_STATE_DIR": str(tmp_path / "state")}
    files = [demo_file(tmp_path, "a.json", 1.0), demo_file(tmp_path, "b.json", 1.1)]
    done = runner("history", *[a for f in files for a in ("--import", f)], "--plot", str(tmp_path / "h.png"), env=env)
    assert done.returncode == 0, done.stderr
    assert "no recorded runs" not in done.stdout and len(done.stdout.splitlines()) == 3, done.stdout
    assert "median_us" in done.stderr and (tmp_path / "h.png").stat().st_size > 5_000
