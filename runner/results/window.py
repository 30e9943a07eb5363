"""A job's service window, from the windows its host's `result` answer lists: how long the services it freed did
not serve, and the parts.

Each freed service's record holds its own window (status.json `downtime`: not serving and its parts, written
by the host once the service is back; the host lists them, remote_payload/verbs/result.py). A job that freed
one service has that window as it is. A job that freed several has one window per service (each service's users
are down for that service's own window) and a combined one for the job: each part the longest of the freed
services', so `not_serving_s` is the job's longest outage; a part some service lacks (None: not healthy again,
or a part it did not see) is unknown for the job too, never the others' longest. Services the job did not stop
hold no window and are in none of it.

Pure: plain dicts in and out.
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
