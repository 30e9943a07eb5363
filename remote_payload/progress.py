"""A payload's progress, read from its JSON event lines (pure; the host's `status` and `runner watch` use it).

The event convention (docs/design.md, "Writing a payload"): one JSON object per stdout line with an
`event` key — `phase` (`phase`, `status`: start|end|error), `heartbeat` (`phase`), `row` (one result row),
`plan` (`rows`: how many rows to expect), `done`, `error`; `t` is seconds since the payload started. The
supervisor adds `variant` lines (`index`, `of`, `args`, `status`) between a sweep's variants.
Anything else on stdout is ordinary output and is ignored here.

A sweep's summary also has `sweep`: {of, done, skipped, running, rows, rows_expected, side_by_side, ...}.
One variant at a time, rows_done/rows_expected are the running variant's; side by side the variants' lines
share the log and a row cannot be told apart per variant, so they are the sweep's.
"""
from __future__ import annotations

import json
import math

SCAN_BYTES = 1 << 20  # the host summarises at most the last MiB of output.log


def parse_event(line) -> dict | None:
    """The event of one output line, or None when the line is not a JSON object with an `event`."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and isinstance(obj.get("event"), str) else None


def new_summary() -> dict:
    return {"phase": None, "phase_status": None, "rows_done": 0, "rows_expected": None, "last_t": None, "errors": 0}


def summarize(text) -> dict:
    """{phase, phase_status, rows_done, rows_expected, last_t, errors} from the event lines in text."""
    summary = new_summary()
    for line in (text.decode("utf-8", "replace") if isinstance(text, bytes) else text).splitlines():
        event = parse_event(line)
        if event is not None:
            fold(summary, event)
    return summary


def fold(summary: dict, event: dict) -> None:
    """One event into a summary (the host's status and `runner watch` keep theirs this way). Events are the
    payload's text: a field of the wrong type is left out, never trusted."""
    kind = event["event"]
    if _number(event.get("t")):
        summary["last_t"] = event["t"]
    if kind == "phase":
        summary["phase"], summary["phase_status"] = _text(event.get("phase")), _text(event.get("status"))
    elif kind == "heartbeat" and _text(event.get("phase")):
        summary["phase"], summary["phase_status"] = event["phase"], "start"
    elif kind == "row":
        summary["rows_done"] += 1
        if "sweep" in summary:
            summary["sweep"]["rows"] += 1
    elif kind == "plan" and _count(event.get("rows")) is not None:
        summary["rows_expected"] = event["rows"]
        if "sweep" in summary:
            fold_plan(summary["sweep"], event["rows"])
    elif kind == "error":
        summary["errors"] += 1
    elif kind == "variant" and event.get("status") in ("start", "end", "skipped"):  # a sweep's boundary (the host's)
        fold_variant(summary, event)
    sweep = summary.get("sweep")
    if sweep:
        sweep["rows_expected"] = sweep_rows_expected(sweep)
        if sweep["side_by_side"]:
            summary["rows_done"], summary["rows_expected"] = sweep["rows"], sweep["rows_expected"]


def fold_variant(summary: dict, event: dict) -> None:
    """A variant's start, end or skip into the sweep's tally; a start or a skip is also `variant`, the last
    one announced. A second variant starting while one runs makes the sweep side by side for good."""
    sweep = summary.setdefault("sweep", {"of": None, "done": 0, "skipped": 0, "running": [], "rows": 0,
                                         "rows_expected": None, "plan": None, "plans_differ": False,
                                         "side_by_side": False})
    index, status = _count(event.get("index")), event["status"]
    sweep["of"] = _count(event.get("of")) if sweep["of"] is None else sweep["of"]
    if status == "start":
        if index is not None and index not in sweep["running"]:
            sweep["running"].append(index)
        sweep["side_by_side"] = sweep["side_by_side"] or len(sweep["running"]) > 1
        if not sweep["side_by_side"]:  # rows count per variant
            summary["rows_done"], summary["rows_expected"] = 0, None
    else:
        sweep["running"] = [k for k in sweep["running"] if k != index]
        sweep["done"] += 1
        sweep["skipped"] += status == "skipped"
    if status != "end":
        args = event.get("args")
        summary["variant"] = {"index": index, "of": _count(event.get("of")),
                              "args": args if isinstance(args, dict) else {}, "status": status}


def fold_plan(sweep: dict, rows: int) -> None:
    """A variant's plan: the sweep's plan per variant while every plan says the same number of rows."""
    if sweep["plan"] is not None and sweep["plan"] != rows:
        sweep["plans_differ"] = True
    sweep["plan"] = None if sweep["plans_differ"] else rows


def sweep_rows_expected(sweep: dict):
    """The sweep's rows to expect: its per-variant plan times the variants not skipped (None: unknown)."""
    if sweep["plan"] is None or sweep["of"] is None:
        return None
    return sweep["plan"] * max(0, sweep["of"] - sweep["skipped"])


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(value):
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _text(value):
    return value if isinstance(value, str) else None


def describe(event: dict) -> str:
    """One short line for a person: `[12.3 s] jit (m=1): start`, `[40.1 s] row m=8: median_us=451.2 …`."""
    t = event.get("t")
    stamp = "[%7.1f s] " % t if isinstance(t, (int, float)) else ""
    kind = event["event"]
    rest = {k: v for k, v in event.items() if k not in ("event", "t", "phase", "status")}
    if kind in ("phase", "heartbeat"):
        head = "%s %s" % (event.get("phase", "?"), event.get("status", "…") if kind == "phase" else "…")
    else:
        head = kind
    return stamp + head + ("" if not rest else "  " + " ".join("%s=%s" % (k, _brief(v)) for k, v in rest.items()))


def _brief(value) -> str:
    if isinstance(value, float):
        return "%.4g" % value
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."
