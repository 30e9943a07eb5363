"""Regression gate: a result's metrics against a saved baseline, each within its measured spread + a tolerance.

Pure functions of parsed JSON (no I/O but `read_baseline`/`write_baseline`). A metric is a value, the
direction that is better, and its measured spread as a relative half-width (± fraction of the value):

    COLUMN_KEY         rows[].COLUMN, the row's KEY       as declared       ± half the range of rows[].rep_COLUMN
    lever_M            lever.by_m[M].lever            higher is better  ± half of ci_high-ci_low, else of max-min
    peak_over_weights  memory.peak_over_weights       lower is better   ± 0 (a deterministic byte count)

Which columns of `rows` are metrics is declared ({key, lower, higher}: the job spec's `metrics`, else the result's
own `metrics`); undeclared, `median_us` keyed by `m` or `size` (the Marlin benchmark, the demo).
A metric passes when its change in the worse direction is at most max(both spreads) + tolerance. A baseline
keeps the GPU clocks its result was measured at (gpu_clocks): the gate notes when the run's differ (clocks.py).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeGuard

from ..errors import BadBaseline, NoResult
from ..local_files import read_regular, write_regular
from . import clocks

SCHEMA = 1
KIND = "runner-baseline"
DIRECTIONS = ("lower", "higher")
WITHIN, REGRESSION, IMPROVED, MISSING, NEW = "within", "regression", "improved", "missing", "new"
FAILING = (REGRESSION, MISSING)


@dataclass(frozen=True)
class Metric:
    value: float
    direction: str  # "lower" or "higher" is better
    spread: float = 0.0  # measured relative half-width, e.g. 0.03 for ±3%


@dataclass(frozen=True)
class Table:
    """Which columns of a result's rows are metrics (column → direction), and which column names a row."""
    keys: tuple[str, ...]
    directions: dict[str, str]


UNDECLARED = Table(("m", "size"), {"median_us": "lower"})
DECLARE_HINT = ("declare them in the job file, e.g. `metrics: {key: batch, lower: [us_per_call], higher: "
                "[tokens_per_s]}` (or as the result's own `metrics` object)")
KEY_TEXT_MAX = 40  # characters of a text key (a model name) in a metric's name


@dataclass(frozen=True)
class Verdict:
    name: str
    verdict: str
    baseline: Metric | None
    current: Metric | None
    change: float | None  # relative change in the worse direction (+0.09 = 9% worse)
    allowed: float | None  # spread + tolerance

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING


# -- metrics from a result --------------------------------------------------------------------------------

def label(name: str) -> str:
    """`lever_512` → `lever(512)`; names without a batch size stay as they are."""
    stem, _, size = name.rpartition("_")
    return f"{stem}({size})" if stem and size.isdigit() else name


WINDOW_PARTS = ("not_serving_s", "release_s", "drain_s", "payload_s", "resume_s", "health_s")


def finite_number(value: object) -> TypeGuard[float]:
    """A JSON number that is a number (not a boolean, not NaN or infinite)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def window_metrics(window: Any) -> dict[str, Metric]:
    """The service window's parts (status.json `service.downtime`) as metrics, lower is better; a part that is
    not a finite number is left out (status.json is the payload's to overwrite)."""
    if not isinstance(window, dict):
        return {}
    return {name: Metric(float(window[name]), "lower") for name in WINDOW_PARTS if finite_number(window.get(name))}


def extract_metrics(result: Any, declared: Any = None) -> dict[str, Metric]:
    """Every gateable metric of one result.json, by name (none when a field has the wrong type); declared:
    the job spec's `metrics` ({key, lower, higher}), over the result's own."""
    if not isinstance(result, dict):
        return {}
    table = declared_table(declared) or declared_table(result.get("metrics")) or UNDECLARED
    metrics = {**_row_metrics(result.get("rows"), table), **_lever_metrics(_object(result.get("lever")))}
    peak = _object(result.get("memory")).get("peak_over_weights")
    if finite_number(peak) and peak > 0:
        metrics["peak_over_weights"] = Metric(float(peak), "lower")
    return metrics


def _object(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def declared_table(declared: Any) -> Table | None:
    """A `metrics` declaration as a Table; None for anything else (a result's own `metrics` may be data)."""
    if not isinstance(declared, dict) or not isinstance(declared.get("key"), str):
        return None
    directions: dict[str, str] = {}
    for direction in DIRECTIONS:
        columns = declared.get(direction, [])
        if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
            return None
        directions.update(dict.fromkeys(columns, direction))
    return Table((declared["key"],), directions) if directions else None


def _row_metrics(rows: Any, table: Table) -> dict[str, Metric]:
    out = {}
    for row in rows if isinstance(rows, list) else []:
        key = next((row[k] for k in table.keys if k in row), None) if isinstance(row, dict) else None
        if not _is_row_key(key):
            continue
        for column, direction in table.directions.items():
            value = row.get(column)
            if finite_number(value) and value > 0:
                out[f"{column}_{key}"] = Metric(float(value), direction, _half_range(row.get(f"rep_{column}"), value))
    return out


def _is_row_key(key: Any) -> bool:
    """A batch size, or a short name (a model) without spaces: it becomes part of a metric's name."""
    if isinstance(key, str):
        return 0 < len(key) <= KEY_TEXT_MAX and key.isprintable() and not any(c.isspace() for c in key)
    return isinstance(key, int) and not isinstance(key, bool)


def _lever_metrics(lever: dict) -> dict[str, Metric]:
    out = {}
    base = str(lever.get("base_m", ""))
    for size, entry in _object(lever.get("by_m")).items():
        value = entry.get("lever") if isinstance(entry, dict) else None
        if str(size) == base or not finite_number(value) or value <= 0:
            continue  # lever(base) is 1 by definition: nothing to gate
        bounds = [entry.get("ci_low"), entry.get("ci_high")]
        if not all(finite_number(b) for b in bounds):
            bounds = [entry.get("min"), entry.get("max")]
        out[f"lever_{size}"] = Metric(float(value), "higher", _half_range(bounds, value))
    return out


def _half_range(values: Any, center: float) -> float:
    values = [v for v in values if finite_number(v)] if isinstance(values, list) else []
    return (max(values) - min(values)) / 2 / center if len(values) >= 2 and center else 0.0


# -- comparing ----------------------------------------------------------------------------------------------

def compare(baseline: dict[str, Metric], current: dict[str, Metric], tolerance: float) -> list[Verdict]:
    """One verdict per metric of either side, baseline order first."""
    names = list(baseline) + [n for n in current if n not in baseline]
    return [judge(n, baseline.get(n), current.get(n), tolerance) for n in names]


def judge(name: str, base: Metric | None, cur: Metric | None, tolerance: float) -> Verdict:
    if base is None:
        return Verdict(name, NEW, None, cur, None, None)
    if cur is None:
        return Verdict(name, MISSING, base, None, None, None)
    sign = 1.0 if base.direction == "lower" else -1.0
    change = sign * (cur.value - base.value) / base.value
    allowed = max(base.spread, cur.spread) + tolerance
    verdict = REGRESSION if change > allowed else IMPROVED if change < -allowed else WITHIN
    return Verdict(name, verdict, base, cur, change, allowed)


def exit_code(verdicts: list[Verdict]) -> int:
    """0 when nothing regressed or went missing, else 1 (2, a bad baseline, is raised before)."""
    return 1 if any(v.failed for v in verdicts) else 0


def parse_tolerance(text: str) -> float:
    """`5%` or `0.05` → 0.05. Raises ValueError saying what is allowed."""
    stripped = str(text).strip()
    try:
        value = float(stripped[:-1]) / 100 if stripped.endswith("%") else float(stripped)
    except ValueError:
        raise ValueError(f"not a tolerance: {text!r} (use e.g. 5% or 0.05)") from None
    if not (math.isfinite(value) and 0 <= value < 10):
        raise ValueError(f"tolerance must be between 0% and 1000%; got {text!r}")
    return value


# -- the baseline file --------------------------------------------------------------------------------------

def baseline_document(result: Any, source: str, now: float | None = None, declared: Any = None) -> dict:
    result = _object(result)
    env = _object(result.get("environment"))
    return {"schema": SCHEMA, "kind": KIND, "source": source, "payload": result.get("payload"),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now if now is not None else time.time())),
            "environment": {k: env.get(k) for k in ("gpu", "driver", "torch", "sglang") if k in env},
            "gpu_clocks": clocks.recorded(result),
            "metrics": {name: asdict(m) for name, m in extract_metrics(result, declared).items()}}


def write_baseline(path: str | Path, result: dict, source: str, declared: Any = None) -> dict:
    document = baseline_document(result, source, declared=declared)
    if not document["metrics"]:
        raise BadBaseline(f"{source}: the result has no gateable metrics (none declared; no rows[].median_us, "
                          f"lever.by_m, memory.peak_over_weights); no baseline written", hint=DECLARE_HINT)
    write_regular(path, (json.dumps(document, indent=1) + "\n").encode(), "a baseline")  # metrics stay in table order
    return document


def read_baseline(path: str | Path) -> dict[str, Metric]:
    """The metrics of a baseline file; BadBaseline (exit 2) naming the file and what is wrong."""
    return parse_baseline(read_baseline_document(path), str(path))


def read_baseline_document(path: str | Path) -> Any:
    """A baseline file's JSON as it is (parse_baseline checks it); BadBaseline when it is no JSON file."""
    try:
        document = json.loads(read_regular(path, "a baseline").decode("utf-8"))
    except OSError as exc:
        raise BadBaseline(f"{path}: cannot read the baseline: {exc.strerror or exc}") from exc
    except NoResult as exc:  # over the size cap
        raise BadBaseline(str(exc), hint=exc.hint) from None
    except (ValueError, RecursionError) as exc:
        raise BadBaseline(f"{path}: not JSON: {str(exc)[:200]}") from exc
    return document


def parse_baseline(document: Any, where: str) -> dict[str, Metric]:
    if not isinstance(document, dict):
        raise BadBaseline(f"{where}: a baseline is a JSON object, got {type(document).__name__}")
    if document.get("kind") != KIND:
        raise BadBaseline(f"{where}: kind: expected {KIND!r}, got {document.get('kind')!r}",
                          hint="write one with `runner results --save-baseline FILE ID`")
    if document.get("schema") != SCHEMA:
        raise BadBaseline(f"{where}: schema: this runner reads schema {SCHEMA}, got {document.get('schema')!r}")
    metrics = document.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        raise BadBaseline(f"{where}: metrics: expected a non-empty object of name → {{value, direction, spread}}")
    return {name: _metric(entry, f"{where}: metrics.{name}") for name, entry in metrics.items()}


def _metric(entry: Any, where: str) -> Metric:
    if not isinstance(entry, dict):
        raise BadBaseline(f"{where}: expected an object with value, direction, spread")
    value, direction, spread = entry.get("value"), entry.get("direction"), entry.get("spread", 0.0)
    if not finite_number(value) or value <= 0:
        raise BadBaseline(f"{where}.value: expected a number > 0, got {value!r}")
    if direction not in DIRECTIONS:
        raise BadBaseline(f"{where}.direction: expected 'lower' or 'higher', got {direction!r}")
    if not finite_number(spread) or spread < 0:
        raise BadBaseline(f"{where}.spread: expected a number >= 0, got {spread!r}")
    return Metric(float(value), direction, float(spread))
