"""A job's service window, from its status: how long the services it freed did not serve, and the parts.

Each freed service's record holds its own window (status.json `downtime`: not serving and its parts, written
by the host once the service is back). A job that freed one service has that window as it is. A job that freed
several has one window per service (each service's users are down for that service's own window) and a
combined one for the job: each part the longest of the freed services', so `not_serving_s` is the job's
longest outage; a part some service lacks (None: not healthy again, or a part it did not see) is unknown for
the job too, never the others' longest. Services the job did not stop hold no window and are in none of it.

Pure: status dicts in, plain dicts out (status.json is the payload's to overwrite: wrong shapes are skipped).
"""
from __future__ import annotations

from typing import Any

from .gate import WINDOW_PARTS, finite_number


def job_window(job: Any) -> dict | None:
    """The job's window: None when it freed nothing; the one freed service's `downtime` as it is; with several,
    the combined parts plus `units` (the freed services, in order) and `services` (each one's window, with its
    `unit`)."""
    return window_of(freed_windows(job))


def window_of(freed: list[tuple[str | None, dict]]) -> dict | None:
    """The window of a job that freed these services ((unit, window) each, freed_windows or the `result`
    answer's `windows`): None for none, the one's as it is, or the combined one of several."""
    if not freed:
        return None
    if len(freed) == 1:
        return freed[0][1]
    return combined(freed)


def freed_windows(job: Any) -> list[tuple[str | None, dict]]:
    """(unit, window) of each service record of the job that holds a window, in the spec's order."""
    records = _records(job)
    return [(r.get("unit") if isinstance(r.get("unit"), str) else None, r["downtime"])
            for r in records if isinstance(r.get("downtime"), dict)]


def combined(freed: list[tuple[str | None, dict]]) -> dict:
    windows = [window for _unit, window in freed]
    methods = list(dict.fromkeys(str(w.get("method")) for w in windows))
    return {"method": "+".join(methods), **{part: _longest([w.get(part) for w in windows]) for part in WINDOW_PARTS},
            "units": [unit for unit, _window in freed],
            "services": [{"unit": unit, **window} for unit, window in freed]}


def _records(job: Any) -> list[dict]:
    """The job's service records: `services` when it has them (several), else its one `service`."""
    if not isinstance(job, dict):
        return []
    listed = job.get("services")
    records = listed if isinstance(listed, list) else [job.get("service")]
    return [r for r in records if isinstance(r, dict)]


def _longest(values: list) -> float | None:
    known = [v for v in values if finite_number(v)]
    return max(known) if known and len(known) == len(values) else None
