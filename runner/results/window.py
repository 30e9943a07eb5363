"""A job's service window: how long the services it freed did not serve, and the parts (pure).

The host's `result` answer lists each freed service's window (status.json `downtime`, written once the service
is back; remote_payload/verbs/result.py). A job that freed one service has that window as it is; one that freed
several has each service's and a combined one: each part the longest of theirs, so `not_serving_s` is the job's
longest outage, and a part some service lacks (not healthy again, or not seen) is unknown for the job too.
"""
from __future__ import annotations

from .gate import WINDOW_PARTS, finite_number


def window_of(freed: list[tuple[str | None, dict]]) -> dict | None:
    """The window of a job that freed these services ((unit, window) each, as the `result` answer's `windows`):
    None for none, the one's as it is; for several, the combined parts plus `units` (the freed services, in
    order) and `services` (each one's window, with its `unit`)."""
    if not freed:
        return None
    if len(freed) == 1:
        return freed[0][1]
    windows = [window for _unit, window in freed]
    methods = list(dict.fromkeys(str(w.get("method")) for w in windows))
    return {"method": "+".join(methods), **{part: _longest([w.get(part) for w in windows]) for part in WINDOW_PARTS},
            "units": [unit for unit, _window in freed],
            "services": [{"unit": unit, **window} for unit, window in freed]}


def _longest(values: list) -> float | None:
    known = [v for v in values if finite_number(v)]
    return max(known) if known and len(known) == len(values) else None
