"""runner.results.history and runner.results.history_report: the SQLite results history, its migrations, and
its failure modes.

Real SQLite files, a real git repository for the spec's revision, the committed H200 results as data.
"""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.deadline import Deadline
from runner.errors import NoResult, RunnerError
from runner.results import gate, history, history_report
from runner.state.store import JobRecord, Store
from tests.cli_helpers import local_target, run_cli

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "results" / "h200"


def result(run: str, name: str) -> dict:
    return json.loads((H200 / run / f"{name}.json").read_text())


@pytest.fixture
def db(tmp_path) -> Path:
    return history.db_path(tmp_path / "state dir; 'x'")


def record(db: Path, job_id: str, res: dict, **kw) -> None:
    assert history.record(db, history.run_from_result(job_id, res, **kw)) is None


def test_a_new_database_is_migrated_to_the_latest_version_once(db):
    conn = history.connect(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(history.MIGRATIONS)
    assert history.migrate(conn) == len(history.MIGRATIONS)  # again: nothing to do, no error
    conn.close()


def test_an_older_database_is_brought_forward(db):
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.executescript(history.MIGRATIONS[0] + "; PRAGMA user_version = 1;")
    conn.close()
    record(db, "j1", result("run2", "warm1"))
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(history.MIGRATIONS)
    assert "metrics_by_name" in {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    conn.close()


def test_a_recorded_result_reads_back_with_environment_variant_and_metrics(db):
    res = result("run2", "warm1")
    record(db, "job-1", res, host="ct200")
    (run,) = history.runs(db)
    assert (run.job_id, run.host, run.payload) == ("job-1", "ct200", "bench_marlin_moe")
    assert run.environment == {"gpu": "NVIDIA H200", "driver": "580.159.04", "torch": "2.11.0+cu130", "sglang": "0.5.17"}
    assert "out" not in run.variant and run.variant["experts"] == 384
    assert run.metrics == gate.extract_metrics(res)


def test_recording_a_job_again_replaces_it(db):
    record(db, "job-1", result("run2", "warm1"))
    record(db, "job-1", result("run2", "warm2"))
    (run,) = history.runs(db)
    assert run.metrics == gate.extract_metrics(result("run2", "warm2"))


def test_filters_by_host_and_metric(db):
    record(db, "a", result("run1", "warm1"), host="h1", now=1.0)
    record(db, "b", result("run2", "warm1"), host="h2", now=2.0)
    record(db, "c", result("run2", "check"), host="h2", now=3.0)
    assert [r.job_id for r in history.runs(db)] == ["a", "b", "c"]
    assert [r.job_id for r in history.runs(db, host="h2")] == ["b", "c"]
    assert [r.job_id for r in history.runs(db, host="h2", metric="lever_512")] == ["b"]


def test_a_corrupt_database_warns_instead_of_breaking_the_caller(db):
    db.parent.mkdir(parents=True)
    db.write_bytes(b"this is not a database\n" * 100)
    warning = history.record(db, history.run_from_result("job-1", result("run2", "warm1")))
    assert warning.startswith("history: job-1 not recorded in ") and "not a database" in warning
    with pytest.raises(RunnerError, match="unreadable"):
        history.runs(db)


def test_a_locked_database_warns_within_the_lock_timeout(db):
    history.connect(db).close()
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        warning = history.record(db, history.run_from_result("job-1", result("run2", "warm1")))
        assert "locked" in warning and time.monotonic() - started < history.LOCK_TIMEOUT_S + 2
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert history.runs(db) == []


def test_a_database_from_a_newer_runner_is_left_alone(db):
    history.connect(db).close()
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    warning = history.record(db, history.run_from_result("job-1", result("run2", "warm1")))
    assert "schema 99, newer than this runner's" in warning


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_record_job_takes_host_spec_hash_and_git_revision_from_the_job_index(tmp_path):
    repo = tmp_path / "bench repo"
    repo.mkdir()
    git(repo, "init", "-q")
    spec = repo / "job.yaml"
    spec.write_text("name: x\npayload: {script: demo_payload.py, args: {seconds: 3}}\n")
    git(repo, "add", "job.yaml")
    git(repo, "commit", "-q", "-m", "spec")
    store = Store(tmp_path / "state")
    store.save(JobRecord(job_id="j1", name="x", host={"address": "gpu-box"}, spec_path=str(spec), submitted_at=1.0))
    assert history.record_job(store, "j1", {"payload": "demo", "rows": [{"size": 1, "median_us": 5.0}]}) is None
    (run,) = history.runs(history.db_path(store.root))
    assert run.host == "gpu-box" and run.git_rev == git(repo, "rev-parse", "HEAD")[:12]
    assert run.spec_hash == history._file_hash(str(spec)) and run.variant == {"seconds": 3}
    spec.write_text(spec.read_text() + "# edited\n")
    assert history.git_revision(repo).endswith("+dirty")
    assert history.git_revision(tmp_path) is None


def test_record_job_of_an_unknown_job_is_a_warning(tmp_path):
    assert "unknown job id" in history.record_job(Store(tmp_path), "nope", {"rows": []})


def test_render_and_plot_the_committed_runs(db, tmp_path):
    for run in ("run1", "run2"):
        for name in ("warm1", "eager", "check"):
            record(db, f"{run}/{name}", result(run, name), host="h200")
    text = history_report.render(history.runs(db, metric="lever_512"), "lever_512")
    assert text.splitlines()[0].split()[-1] == "lever(512)" and len(text.splitlines()) == 5
    assert "timing=eager" in text and "default" in text
    pytest.importorskip("matplotlib")
    out = history_report.plot(history.runs(db), "lever_512", tmp_path / "h.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(NoResult, match="no recorded run has lever_9999"):
        history_report.plot(history.runs(db), "lever_9999", tmp_path / "x.png")


def test_cli_history_imports_lists_and_plots(tmp_path):
    files = [str(H200 / run / "warm1.json") for run in ("run1", "run2")]
    args = [a for f in files for a in ("--import", f)]
    done = subprocess.run([sys.executable, "-m", "runner", "history", *args, "--metric", "lever_512",
                           "--plot", str(tmp_path / "h.png")], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and lines[1].split()[2].endswith("run1/warm1.json") and "11.75" in lines[1]
    assert (tmp_path / "h.png").stat().st_size > 10_000


def test_metric_names_sort_by_batch_size_and_the_default_falls_back_to_one_recorded(db):
    assert history.metric_names(db) == [] and history_report.default_metric([]) == "lever_512"
    record(db, "demo", {"payload": "demo", "rows": [{"size": n, "median_us": 1.0 * n} for n in (16, 4, 1)]})
    assert history.metric_names(db) == ["median_us_1", "median_us_4", "median_us_16"]
    assert history_report.default_metric(history.metric_names(db)) == "median_us_1"
    record(db, "marlin", result("run2", "warm1"))
    assert history_report.default_metric(history.metric_names(db)) == "lever_512"


def test_a_result_of_any_shape_is_recorded_with_unknown_fields_empty(db):
    record(db, "list", [{"m": 1}])
    record(db, "odd", {"payload": {"name": "x"}, "environment": {"gpu": ["H200"], "torch": 2.1}, "args": "x"})
    runs = {r.job_id: r for r in history.runs(db)}
    assert runs["list"].payload is None and runs["list"].metrics == {}
    assert (runs["odd"].payload, runs["odd"].environment["gpu"], runs["odd"].environment["torch"]) == (None, None, "2.1")


def test_history_reads_the_submitted_spec_not_the_file_as_it_is_now(tmp_path):
    """The job record keeps the wire form the host was sent (`--set` overrides included): an edit of the job
    file after the submit changes neither the recorded variant nor the spec hash."""
    from runner.commands import controller

    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: x\nhost: {{address: local, root: '{tmp_path / 'root'}'}}\n"
                    "payload: {script: demo_payload.py, args: {seconds: 1, sizes: [1]}}\n")
    store = Store(tmp_path / "state")
    done = controller.submit(str(spec), ["payload.args.seconds=2"], store=store, progress=lambda _m: None,
                             deadline=Deadline.for_command(50))
    submitted = store.load(done.job_id).wire
    assert submitted["payload"]["args"][:2] == ["--seconds", "2"]
    spec.write_text(spec.read_text().replace("seconds: 1", "seconds: 9"))
    assert history.record_job(store, done.job_id, {"payload": "demo", "rows": [{"size": 1, "median_us": 5.0}]}) is None
    (run,) = history.runs(history.db_path(store.root))
    assert run.variant == {"seconds": "2", "sizes": "1"}
    assert run.spec_hash == history.wire_hash(submitted)


def _history_runs(state: Path) -> None:
    """Two jobs on two hosts, the demo payload with seconds 20 and 5; the older job's result recorded last."""
    store = Store(state)
    for job_id, host, seconds, submitted in (("j-new", "box-b", 5, 2000.0), ("j-old", "box-a", 20, 1000.0)):
        wire = {"job_id": job_id, "payload": {"args": ["--seconds", str(seconds)]}}
        store.save(JobRecord(job_id=job_id, name="demo", host={"address": host}, spec_path="demo.yaml",
                             submitted_at=submitted, wire=wire))
        assert history.record_job(store, job_id, {"payload": "demo", "rows": [{"size": 1, "median_us": 5.0}]}) is None


def test_history_lists_the_oldest_job_first_whenever_its_result_was_recorded(work):
    _history_runs(work / "state")
    every = run_cli(local_target({"RUNNER_STATE_DIR": str(work / "state")}), "history").stdout.decode().splitlines()
    assert [line.split()[2] for line in every[1:]] == ["j-old", "j-new"], every


def test_history_labels_a_variant_the_same_whichever_rows_are_shown(work):
    _history_runs(work / "state")
    target = local_target({"RUNNER_STATE_DIR": str(work / "state")})
    every = run_cli(target, "history").stdout.decode().splitlines()
    labels = {line.split()[2]: line.split()[-2] for line in every[1:]}
    assert len(set(labels.values())) == 2, every
    for job_id, host in (("j-old", "box-a"), ("j-new", "box-b")):
        one = run_cli(target, "history", "--host", host).stdout.decode().splitlines()
        assert len(one) == 2 and one[1].split()[-2] == labels[job_id], (one, labels)
