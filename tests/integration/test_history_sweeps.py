"""runner.results.history over a sweep: each variant that left a result is a run of its own in the history.

The sweep's combined record is built as the host writes it (docs/protocol.md, "A sweep's result.json"), its
variants' results the committed H200 sweep's (results/h200/sweep/variant-K.json); real SQLite files.
"""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.results import gate, history, history_report
from runner.state.store import JobRecord, Store

REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "results" / "h200" / "sweep"
WINDOW = {"not_serving_s": 212.5, "stop_s": 3.2, "restore_s": 41.0}


def variant_result(k: int) -> dict:
    return json.loads((SWEEP / f"variant-{k}.json").read_text())


def ended(index: int, args: dict, result) -> dict:
    return {"index": index, "args": args, "status": "ended", "exit_code": 0, "seconds": 61.2, "reason": None,
            "error": None, "result": result, "columns": ["m", "median_us"], "slot": 0, "devices": []}


def sweep_record(first: dict | None = None, second: dict | None = None) -> dict:
    """Four variants: two measured, one whose result file was no JSON object, one skipped after it."""
    failed = {**ended(3, {"experts": 128, "routing": "uniform"}, None), "exit_code": 1,
              "reason": "results/variant-3.json is not a JSON object", "error": "results/variant-3.json is not a JSON object"}
    skipped = {"index": 4, "args": {"experts": 128, "routing": "zipf"}, "status": "skipped", "exit_code": None,
               "seconds": None, "reason": "not started: variant 3 failed and sweep.fail_fast is set", "error": None,
               "result": None, "columns": None}
    return {"payload": "sweep", "sweep": {"variants": 4, "succeeded": 2, "failed": 1, "skipped": 1},
            "variants": [ended(1, {"experts": 384, "routing": "uniform"}, first or variant_result(1)),
                         ended(2, {"experts": 384, "routing": "zipf"}, second or variant_result(2)), failed, skipped]}


def sweep_job(store: Store, job_id: str = "k26-sweep-1", wire: dict | None = None) -> None:
    wire = wire or {"name": "k26-marlin-sweep", "job_id": job_id,
                    "payload": {"args": ["--experts", "384", "--routing", "uniform", "--timing", "graph"]},
                    "sweep": {"fail_fast": True, "variants": []}}
    store.save(JobRecord(job_id=job_id, name="k26-marlin-sweep", host={"address": "h200-box"},
                         spec_path=str(REPO / "jobs" / "k26_marlin_sweep.yaml"), submitted_at=1.0, wire=wire))


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "state")


def recorded(store: Store) -> list[history.Run]:
    return history.runs(history.db_path(store.root))


def test_a_sweep_is_recorded_as_one_run_per_variant_with_a_result(store):
    sweep_job(store)
    assert history.record_job(store, "k26-sweep-1", sweep_record(), WINDOW) is None
    runs = recorded(store)
    assert [(r.job_id, r.variant_index) for r in runs] == [("k26-sweep-1", 1), ("k26-sweep-1", 2)]
    for run, k, routing in zip(runs, (1, 2), ("uniform", "zipf")):
        assert run.variant["experts"] == 384 and run.variant["routing"] == routing and "out" not in run.variant
        assert run.metrics == {**gate.extract_metrics(variant_result(k)), **gate.window_metrics(WINDOW)}
        assert "lever_512" in run.metrics and run.payload == "bench_marlin_moe" and run.host == "h200-box"
        assert run.environment == {"gpu": "NVIDIA H200", "driver": "580.159.04", "torch": "2.11.0+cu130",
                                   "sglang": "0.5.17"}
    assert runs[0].spec_hash == runs[1].spec_hash == history.wire_hash(store.load("k26-sweep-1").wire)


def test_recording_a_sweep_again_replaces_its_runs(store):
    sweep_job(store)
    history.record_job(store, "k26-sweep-1", sweep_record())
    again = sweep_record(first=variant_result(3), second=variant_result(4))
    assert history.record_job(store, "k26-sweep-1", again) is None
    runs = recorded(store)
    assert [r.variant_index for r in runs] == [1, 2]
    assert [r.metrics for r in runs] == [gate.extract_metrics(variant_result(k)) for k in (3, 4)]


def test_a_variant_without_args_of_its_own_takes_the_submitted_args_with_its_own_over_them(store):
    wire = {"name": "demo", "job_id": "demo-sweep", "payload": {"args": ["--seconds", "1", "--sizes", "1", "--out", "x"]},
            "sweep": {"fail_fast": False, "variants": []}}
    sweep_job(store, "demo-sweep", wire)
    demo = {"payload": "demo", "rows": [{"size": 4, "median_us": 9.0}]}
    record = {"payload": "sweep", "variants": [ended(1, {"sizes": [4]}, demo), ended(2, {"sizes": [16]}, demo)]}
    assert history.record_job(store, "demo-sweep", record) is None
    assert [r.variant for r in recorded(store)] == [{"seconds": "1", "sizes": [4]}, {"seconds": "1", "sizes": [16]}]


def test_a_plain_job_is_still_one_run_of_variant_index_zero(store):
    store.save(JobRecord(job_id="plain", name="x", host={"address": "h"}, spec_path="", submitted_at=1.0))
    assert history.record_job(store, "plain", variant_result(1), WINDOW) is None
    (run,) = recorded(store)
    assert (run.job_id, run.variant_index, run.variant["routing"]) == ("plain", 0, "uniform")
    assert run.metrics == {**gate.extract_metrics(variant_result(1)), **gate.window_metrics(WINDOW)}


def test_a_sweep_with_no_variant_result_records_nothing(store):
    sweep_job(store)
    record = sweep_record()
    record["variants"] = record["variants"][2:]
    assert history.record_job(store, "k26-sweep-1", record) is None
    assert recorded(store) == []


def test_a_sweep_and_a_plain_job_render_apart_and_plot_one_series_per_variant(store, tmp_path):
    store.save(JobRecord(job_id="plain", name="x", host={"address": "h200-box"}, spec_path="", submitted_at=1.0))
    history.record_job(store, "plain", variant_result(1))
    sweep_job(store)
    history.record_job(store, "k26-sweep-1", sweep_record())
    runs = recorded(store)
    lines = history_report.render(runs, "lever_512").splitlines()
    assert [line.split()[2] for line in lines[1:]] == ["plain", "k26-sweep-1#1", "k26-sweep-1#2"]
    assert "routing=zipf" in lines[3] and "routing=zipf" not in lines[1] + lines[2]
    assert sorted(history_report.variant_labels(runs).values()) == ["default", "routing=zipf"]
    pytest.importorskip("matplotlib")
    out = history_report.plot(runs, "lever_512", tmp_path / "h.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the schema: a database the runner of one row per job made is brought forward ----------------------------

def test_a_database_of_one_row_per_job_is_brought_forward_with_its_rows_and_metrics(store):
    """Version 2 (job_id UNIQUE, no variant index): its rows become plain runs, variant index 0; a sweep can
    then be recorded beside them and a job recorded again still replaces its row."""
    db = history.db_path(store.root)
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.executescript(history.MIGRATIONS[0] + ";" + history.MIGRATIONS[1] + "; PRAGMA user_version = 2;")
    conn.execute("INSERT INTO runs (id, job_id, recorded_at, host, spec_hash, variant, git_rev, payload, gpu)"
                 " VALUES (7, 'old', 5.0, 'h', 'abc', '{\"experts\": 384}', 'deadbeef', 'bench_marlin_moe', 'NVIDIA H200')")
    conn.execute("INSERT INTO metrics VALUES (7, 'lever_512', 11.75, 0.01, 'higher')")
    conn.close()

    (old,) = history.runs(db)
    assert (old.job_id, old.variant_index, old.host, old.variant, old.git_rev) == ("old", 0, "h", {"experts": 384}, "deadbeef")
    assert old.metrics == {"lever_512": gate.Metric(11.75, "higher", 0.01)}
    sweep_job(store)
    assert history.record_job(store, "k26-sweep-1", sweep_record()) is None
    assert history.record(db, history.run_from_result("old", variant_result(3))) is None
    assert sorted((r.job_id, r.variant_index) for r in history.runs(db)) == [("k26-sweep-1", 1), ("k26-sweep-1", 2),
                                                                             ("old", 0)]
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(history.MIGRATIONS)
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    assert conn.execute("SELECT count(*) FROM metrics WHERE run_id = 7").fetchone()[0] == 0  # replaced, not orphaned
    indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"metrics_by_name", "runs_by_host"} <= indexes
    conn.close()


def test_a_newer_database_is_left_as_it_is(store):
    db = history.db_path(store.root)
    history.connect(db).close()
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    schema = conn.execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall()
    conn.close()
    sweep_job(store)
    assert "schema 99, newer than this runner's" in history.record_job(store, "k26-sweep-1", sweep_record())
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall() == schema
    assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
    conn.close()


# -- the CLI --------------------------------------------------------------------------------------------------

def test_cli_history_imports_a_sweep_lists_its_variants_and_carries_the_index_in_json(tmp_path):
    path = tmp_path / "result.json"
    path.write_text(json.dumps(sweep_record()))

    def runner(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "runner", "history", *args], capture_output=True, text=True,
                              cwd=REPO, timeout=120)
        assert done.returncode == 0, done.stderr
        return done

    lines = runner("--import", str(path), "--metric", "lever_512", "--plot", str(tmp_path / "h.png")).stdout.splitlines()
    assert len(lines) == 3 and [line.split()[2] for line in lines[1:]] == [f"{path}#1", f"{path}#2"]
    assert "routing=zipf" in lines[2] and (tmp_path / "h.png").stat().st_size > 10_000
    rows = json.loads(runner("--json").stdout)
    assert [(r["job_id"], r["variant_index"], r["variant"]["routing"]) for r in rows] == [
        (str(path), 1, "uniform"), (str(path), 2, "zipf")]


# -- any shape ------------------------------------------------------------------------------------------------

VARIANT = st.fixed_dictionaries({}, optional={
    "index": st.none() | st.booleans() | st.integers(-3, 5) | st.just(2**70) | st.text(max_size=3),
    "args": st.none() | st.lists(st.integers(), max_size=2) | st.dictionaries(st.sampled_from(["out", "m", "x"]),
                                                                             st.integers() | st.text(max_size=3)),
    "result": st.none() | st.text(max_size=3) | st.just({"rows": [{"m": 1, "median_us": 2.0}], "args": {"x": 1}})
              | st.just({"environment": {"gpu": ["x"]}, "args": "x"}) | st.lists(st.integers(), max_size=2)})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.fixed_dictionaries({"payload": st.just("sweep")},
                             optional={"variants": st.none() | st.text(max_size=3)
                                       | st.lists(VARIANT | st.integers() | st.none(), max_size=5)}))
def test_a_sweep_record_of_any_shape_is_recorded_without_raising(tmp_path, value):
    db = history.db_path(tmp_path / uuid.uuid4().hex)  # one database per example
    found = history.runs_from_result("j", value)
    assert history.record(db, *found) is None
    assert len({r.variant_index for r in found}) == len(found) == len(history.runs(db))
