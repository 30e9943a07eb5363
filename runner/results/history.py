"""Results history: every collected result as a row in a local SQLite database in the state dir.

One row per run: a plain job is one run (variant index 0), a sweep one per variant that left a result (its
index, from 1); recording a job again replaces its rows. A row holds the job id, when, host, spec hash, variant
args, the spec repository's git revision, the result's environment (GPU, driver, torch, sglang) and the gate's
metrics. Schema changes are numbered migrations tracked in PRAGMA user_version.

Recording never breaks the calling command: `record_*` return a warning string instead of raising when the
database is corrupt, locked, or from a newer runner. Reading (`runner history`) raises RunnerError.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import RunnerError
from ..state.store import Store, private_dir, private_file
from . import gate

DB_NAME = "history.sqlite3"
LOCK_TIMEOUT_S = 2.0
ENV_KEYS = ("gpu", "driver", "torch", "sglang")
TEXT_MAX = 200  # characters kept of a result's payload name or environment field
MIGRATIONS = (
    """CREATE TABLE runs (
           id INTEGER PRIMARY KEY, job_id TEXT NOT NULL UNIQUE, recorded_at REAL NOT NULL, host TEXT,
           spec_hash TEXT, variant TEXT NOT NULL, git_rev TEXT, payload TEXT,
           gpu TEXT, driver TEXT, torch TEXT, sglang TEXT);
       CREATE TABLE metrics (
           run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE, name TEXT NOT NULL,
           value REAL NOT NULL, spread REAL NOT NULL, direction TEXT NOT NULL, PRIMARY KEY (run_id, name));""",
    "CREATE INDEX metrics_by_name ON metrics(name); CREATE INDEX runs_by_host ON runs(host, recorded_at);",
    # A row per (job, variant): SQLite drops no UNIQUE constraint, so the table is rebuilt, ids kept for metrics.
    """CREATE TABLE runs_next (
           id INTEGER PRIMARY KEY, job_id TEXT NOT NULL, variant_index INTEGER NOT NULL DEFAULT 0,
           recorded_at REAL NOT NULL, host TEXT, spec_hash TEXT, variant TEXT NOT NULL, git_rev TEXT, payload TEXT,
           gpu TEXT, driver TEXT, torch TEXT, sglang TEXT, UNIQUE (job_id, variant_index));
       INSERT INTO runs_next (id, job_id, recorded_at, host, spec_hash, variant, git_rev, payload, gpu, driver, torch,
                              sglang)
           SELECT id, job_id, recorded_at, host, spec_hash, variant, git_rev, payload, gpu, driver, torch, sglang
           FROM runs;
       DROP TABLE runs;
       ALTER TABLE runs_next RENAME TO runs;
       CREATE INDEX runs_by_host ON runs(host, recorded_at);""",
    # Runs are listed by when their job was submitted: recording an old job's result again keeps its place.
    "ALTER TABLE runs ADD COLUMN submitted_at REAL",
)
MAX_INDEX = 2**31  # a variant index past it (the host counts from 1) is not the host's: the position stands in


@dataclass
class Run:
    job_id: str
    recorded_at: float
    host: str | None
    spec_hash: str | None
    variant: dict
    git_rev: str | None
    payload: str | None
    environment: dict
    metrics: dict[str, gate.Metric] = field(default_factory=dict)
    variant_index: int = 0  # a sweep's variant (from 1); 0 for a plain job
    submitted_at: float | None = None  # the job's submit (the local job index's); None for an imported file


def db_path(state_dir: Path) -> Path:
    return Path(state_dir) / DB_NAME


# -- opening and migrating ----------------------------------------------------------------------------------

def connect(path: Path, timeout: float = LOCK_TIMEOUT_S) -> sqlite3.Connection:
    """Open (creating) and migrate. Raises sqlite3.Error, OSError, or RunnerError for a newer schema."""
    private_dir(path.parent)
    if not path.exists():
        private_file(path)  # sqlite makes its journal files with the database's mode: 0600 too
    conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)  # transactions are explicit
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        migrate(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def migrate(conn: sqlite3.Connection) -> int:
    """Apply the migrations past PRAGMA user_version, each in one transaction; return the version."""
    if conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS):
        return len(MIGRATIONS)  # up to date: no write lock needed
    enforced = conn.execute("PRAGMA foreign_keys").fetchone()[0]
    conn.execute("PRAGMA foreign_keys = OFF")  # a rebuilt table's DROP must not cascade to the metrics it keeps
    try:
        _apply(conn)
    finally:
        conn.execute(f"PRAGMA foreign_keys = {int(enforced)}")
    return len(MIGRATIONS)


def _apply(conn: sqlite3.Connection) -> None:
    for number, script in enumerate(MIGRATIONS, start=1):
        conn.execute("BEGIN IMMEDIATE")  # re-read under the write lock: another process may have migrated
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > len(MIGRATIONS):
                raise RunnerError(f"the history database is schema {version}, newer than this runner's "
                                  f"{len(MIGRATIONS)}", hint="upgrade runner, or set RUNNER_STATE_DIR elsewhere")
            if version < number:
                for statement in filter(str.strip, script.split(";")):
                    conn.execute(statement)
                if conn.execute("PRAGMA foreign_key_check").fetchone():
                    raise sqlite3.IntegrityError(f"migration {number} would leave metrics without their run")
                conn.execute(f"PRAGMA user_version = {number}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise


# -- recording ------------------------------------------------------------------------------------------------

def runs_from_result(job_id: str, result: Any, *, host: str | None = None, spec_path: str | None = None,
                     now: float | None = None, wire: dict | None = None, submitted_at: float | None = None,
                     declared: dict | None = None) -> list[Run]:
    """The rows for one job's result: a plain result is one run; a sweep's combined record one run per variant
    with a result object, its args over the job's (none when no variant left one). declared: the job spec's
    `metrics` (gate.extract_metrics)."""
    variants = sweep_variants(result)
    if variants is None:
        run = run_from_result(job_id, result, host=host, spec_path=spec_path, now=now, wire=wire, declared=declared)
        return [replace(run, submitted_at=submitted_at)]
    job = replace(_job_run(job_id, host, spec_path, now, wire), submitted_at=submitted_at)
    return [_measured(job, outcome, variant_of(outcome, spec_path, wire, args), index, declared)
            for index, args, outcome in variants]


def run_from_result(job_id: str, result: Any, *, host: str | None = None, spec_path: str | None = None,
                    now: float | None = None, wire: dict | None = None, declared: dict | None = None) -> Run:
    """The row for one result: any JSON value (fields of the wrong type are recorded as unknown). wire: the
    spec as submitted (the job record's), which names the variant and the spec hash; else the file's."""
    result = result if isinstance(result, dict) else {}
    return _measured(_job_run(job_id, host, spec_path, now, wire), result, variant_of(result, spec_path, wire),
                     declared=declared)


def _job_run(job_id: str, host: str | None, spec_path: str | None, now: float | None, wire: dict | None) -> Run:
    """What a job's runs share: when, where, which spec at which revision (nothing measured yet)."""
    return Run(job_id=job_id, recorded_at=time.time() if now is None else now, host=host,
               spec_hash=wire_hash(wire) if wire else _file_hash(spec_path), variant={},
               git_rev=git_revision(Path(spec_path).parent) if spec_path else None, payload=None, environment={})


def _measured(job: Run, result: dict, variant: dict, index: int = 0, declared: dict | None = None) -> Run:
    """The job's run with one payload result's name, environment and metrics."""
    env = result.get("environment")
    if not isinstance(env, dict):
        env = {}
    return replace(job, variant=variant, variant_index=index, payload=_text(result.get("payload")),
                   environment={k: _text(env.get(k)) for k in ENV_KEYS}, metrics=gate.extract_metrics(result, declared))


def sweep_variants(result: Any) -> list[tuple[int, dict, dict]] | None:
    """A sweep's combined record as [(index, args, result)] of the variants that left a result object, by index
    (a later duplicate index wins); None for anything that is not a sweep's record."""
    if not isinstance(result, dict) or result.get("payload") != "sweep" or not isinstance(result.get("variants"), list):
        return None
    found: dict[int, tuple[dict, dict]] = {}
    for position, variant in enumerate(result["variants"], start=1):
        if not isinstance(variant, dict) or not isinstance(variant.get("result"), dict):
            continue
        index = variant.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 < index < MAX_INDEX:
            index = position
        args = variant.get("args")
        found[index] = (args if isinstance(args, dict) else {}, variant["result"])
    return [(index, *found[index]) for index in sorted(found)]


def _text(value: Any) -> str | None:
    """A result's name-like field as a column value: text (clipped), or None for anything but a scalar."""
    if value is None or isinstance(value, (dict, list)):
        return None
    return str(value)[:TEXT_MAX]


def variant_of(result: dict, spec_path: str | None = None, wire: dict | None = None,
               sweep_args: dict | None = None) -> dict:
    """The payload's arguments that define the measurement (not where it wrote its output): the result's own,
    else those submitted (the wire form's argv), else the job file's as it is now; a sweep variant's over them."""
    args = result.get("args")
    if not isinstance(args, dict):
        args = _wire_payload_args(wire) if wire else (_spec_payload_args(spec_path) if spec_path else {})
    return {k: v for k, v in {**args, **(sweep_args or {})}.items() if k != "out"}


def _wire_payload_args(wire: dict) -> dict:
    """`--key value` / `--flag` pairs of the submitted argv as {key: value} (values as the host got them)."""
    argv = (wire.get("payload") or {}).get("args") if isinstance(wire.get("payload"), dict) else None
    if not isinstance(argv, list):
        return {}
    args: dict[str, str | bool] = {}
    key: str | None = None
    for word in map(str, argv):
        if word.startswith("--"):
            key = word[2:].replace("-", "_")
            args[key] = True
        elif key is not None:
            args[key], key = word, None
    return args


def wire_hash(wire: dict) -> str:
    """The submitted spec's identity: its wire form without the job id (the same spec, submitted again, hashes
    the same)."""
    same = {k: v for k, v in wire.items() if k != "job_id"}
    return hashlib.sha256(json.dumps(same, sort_keys=True).encode()).hexdigest()[:16]


def _spec_payload_args(spec_path: str) -> dict:
    import yaml

    try:
        document = yaml.safe_load(Path(spec_path).read_text()) or {}
        args = (document.get("payload") or {}).get("args")
    except (OSError, yaml.YAMLError, AttributeError):
        return {}
    return args if isinstance(args, dict) else {}


def _file_hash(path: str | None) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16] if path else None
    except OSError:
        return None


def git_revision(directory: Path) -> str | None:
    """HEAD of the repository holding `directory`, `+dirty` with uncommitted changes; None outside git."""
    def git(*argv: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(directory), *argv], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    rev = git("rev-parse", "HEAD")
    if not rev:
        return None
    return rev[:12] + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def save(conn: sqlite3.Connection, *runs: Run) -> None:
    """Save the runs in one transaction, in place of every row their jobs had."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for job_id in dict.fromkeys(run.job_id for run in runs):
            conn.execute("DELETE FROM runs WHERE job_id = ?", (job_id,))
        for run in runs:
            _insert(conn, run)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _insert(conn: sqlite3.Connection, run: Run) -> None:
    cursor = conn.execute(
        "INSERT INTO runs (job_id, variant_index, recorded_at, host, spec_hash, variant, git_rev, payload, gpu,"
        " driver, torch, sglang, submitted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (run.job_id, run.variant_index, run.recorded_at, run.host, run.spec_hash,
         json.dumps(run.variant, sort_keys=True), run.git_rev, run.payload, *(run.environment.get(k) for k in ENV_KEYS),
         run.submitted_at))
    conn.executemany("INSERT INTO metrics (run_id, name, value, spread, direction) VALUES (?, ?, ?, ?, ?)",
                     [(cursor.lastrowid, name, m.value, m.spread, m.direction) for name, m in run.metrics.items()])


def record(path: Path, *runs: Run) -> str | None:
    """Save one job's runs (nothing to do without any); a warning string (never an exception) when the
    database cannot take them."""
    if not runs:
        return None
    try:
        conn = connect(path)
        try:
            save(conn, *runs)
        finally:
            conn.close()
    except (sqlite3.Error, OSError, RunnerError) as exc:
        return f"history: {runs[0].job_id} not recorded in {path}: {exc}"
    return None


def record_job(store: Store, job_id: str, result: dict, window: dict | None = None) -> str | None:
    """Record a fetched job result (a sweep's: a run per variant), with what the local job index knows of its
    host and spec, and the service window's parts (`not_serving_s`, …) as metrics of their own on each run (a
    sweep's variants share the one window)."""
    try:
        job = store.load(job_id)
    except RunnerError as exc:
        return f"history: {job_id} not recorded: {exc}"
    runs = runs_from_result(job_id, result, host=job.host.get("address"), spec_path=job.spec_path, wire=job.wire,
                            submitted_at=job.submitted_at, declared=job.metrics or None)
    for run in runs:
        run.metrics.update(gate.window_metrics(window))
    return record(db_path(store.root), *runs)


# -- reading --------------------------------------------------------------------------------------------------

def runs(path: Path, *, host: str | None = None, metric: str | None = None) -> list[Run]:
    """Recorded runs, oldest job first (by its submit; an imported file by its recording); with `metric`,
    only runs that have it. Raises RunnerError if unreadable."""
    return _reading(path, lambda conn: _select(conn, host, metric))


def metric_names(path: Path) -> list[str]:
    """Every metric some recorded run has, by name then batch size (median_us_4 before median_us_16)."""
    names = _reading(path, lambda conn: [row[0] for row in conn.execute("SELECT DISTINCT name FROM metrics")])
    return sorted(names, key=_name_order)


def _reading(path: Path, read: Callable[[sqlite3.Connection], list]) -> list:
    """What `read` finds in the database ([] when there is none); RunnerError when it cannot be read."""
    if not path.exists():
        return []
    try:
        conn = connect(path)
        try:
            return read(conn)
        finally:
            conn.close()
    except (sqlite3.Error, OSError) as exc:
        raise RunnerError(f"history database {path} is unreadable: {exc}",
                          hint="move it aside; the next collected result starts a new one") from exc


def _name_order(name: str) -> tuple[str, int]:
    stem, _, size = name.rpartition("_")
    return (stem, int(size)) if stem and size.isdigit() else (name, -1)


def _select(conn: sqlite3.Connection, host: str | None, metric: str | None) -> list[Run]:
    where, params = [], []
    if host:
        where.append("host = ?")
        params.append(host)
    if metric:
        where.append("id IN (SELECT run_id FROM metrics WHERE name = ?)")
        params.append(metric)
    sql = ("SELECT id, job_id, recorded_at, host, spec_hash, variant, git_rev, payload, gpu, driver, torch, sglang,"
           " variant_index, submitted_at FROM runs" + (" WHERE " + " AND ".join(where) if where else "")
           + " ORDER BY COALESCE(submitted_at, recorded_at), id")  # a job's variants are saved in index order
    found = []
    for row in conn.execute(sql, params).fetchall():
        metrics = {name: gate.Metric(value, direction, spread) for name, value, spread, direction in conn.execute(
            "SELECT name, value, spread, direction FROM metrics WHERE run_id = ?", (row[0],))}
        found.append(Run(row[1], row[2], row[3], row[4], json.loads(row[5]), row[6], row[7],
                         dict(zip(ENV_KEYS, row[8:12])), metrics, variant_index=row[12], submitted_at=row[13]))
    return found
