"""A payload's progress, read from its JSON event lines (stdlib, pure; used by the host's `status` and by
`runner watch` on the controller).

The event convention (docs/design.md, "Writing a payload"): one JSON object per stdout line with an
`event` key — `phase` (`phase`, `status`: start|end|error), `heartbeat` (`phase`), `row` (one result row),
`plan` (`rows`: how many rows to expect), `done`, `error`; `t` is seconds since the payload started. The
supervisor adds `variant` lines (`index`, `of`, `args`, `status`) between a sweep's variants.
Anything else on stdout is ordinary output and is ignored here.
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
    elif kind == "plan" and _count(event.get("rows")) is not None:
        summary["rows_expected"] = event["rows"]
    elif kind == "error":
        summary["errors"] += 1
    elif kind == "variant" and event.get("status") in ("start", "skipped"):  # a sweep's boundary (the host's)
        args = event.get("args")
        summary["variant"] = {"index": _count(event.get("index")), "of": _count(event.get("of")),
                              "args": args if isinstance(args, dict) else {}, "status": event["status"]}
        if event.get("status") == "start":  # rows count per variant
            summary["rows_done"], summary["rows_expected"] = 0, None


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
