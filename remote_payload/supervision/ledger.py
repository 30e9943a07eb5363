"""The host ledger: "service S (on GPUs G) was stopped by job J and is not restored yet".

One small JSON file per service beside the locks (ROOT/locks/ledger-service-<unit>.json), written atomically
before the stop and removed only by a restorer that saw the unit back (a failed restore marks it tried), so it outlives every process of the job: the
supervisor, its guard and the guard timer can all die and the next job on that service still learns that
the service is down because of J, not because someone wanted it down. Whoever holds the service's lock
settles an entry that names another job: it adopts the stop ("already stopped by J, I will restore it")
or finds the service running again and drops the entry. Imports only the stdlib and supervision/files.py.
"""
from __future__ import annotations

import os
import time

from .files import fsync_dir, locks_dir, read_json, stamp, try_unlink, write_json_atomic


PREFIX = "ledger-service-"


def ledger_path(root: str, unit: str) -> str:
    return os.path.join(locks_dir(root), "%s%s.json" % (PREFIX, unit))


def read_entry(root: str, unit: str):
    """The entry for `unit`, or None. An unreadable entry still means "stopped by someone": keep it."""
    path = ledger_path(root, unit)
    try:
        entry = read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"unit": unit, "job_id": None, "was": "active", "stopped_at": None, "unreadable": True}
    return entry if isinstance(entry, dict) else None


def record_stop(root: str, unit: str, job_id: str, service: dict, gpus: list, **extra) -> None:
    """Before the stop: the host now knows job_id is about to stop unit and owes it a restore."""
    os.makedirs(locks_dir(root), exist_ok=True)
    write_json_atomic(ledger_path(root, unit), dict({
        "unit": unit, "job_id": job_id, "was": service.get("was"), "scope": service.get("scope"),
        "sudo": service.get("sudo"), "health_url": service.get("health_url"),
        "health_timeout": service.get("health_timeout"), "gpus": list(gpus), "stopped_at": time.time(), **stamp()},
        **extra))


def note_payload(root: str, unit: str, job_id: str, payload: dict) -> None:
    """The payload process now running under job_id's stop (pid, pgid, start time): a restorer that cannot
    trust the job's status.json still kills what is left of it."""
    _note(root, unit, job_id, payload=ident(payload))


def note_slots(root: str, unit: str, job_id: str, running: list) -> None:
    """The processes of a sweep's busy slots (variants side by side), for the same restorer."""
    _note(root, unit, job_id, slots=[ident(p) for p in running])


def note_restore_failed(root: str, unit: str, job_id: str) -> None:
    """A restore of job_id's stop ran and the unit did not come back healthy: still owed, tried."""
    _note(root, unit, job_id, restore_failed_at=time.time())


def ident(payload: dict) -> dict:
    return {k: payload.get(k) for k in ("pid", "pgid", "start_time")}


def _note(root: str, unit: str, job_id: str, **fields) -> None:
    entry = read_entry(root, unit)
    if entry and entry.get("job_id") == job_id and not entry.get("unreadable"):
        write_json_atomic(ledger_path(root, unit), dict(entry, **fields))


def entries_of(root: str, job_id: str) -> list:
    """Every entry naming job_id: the stops it made and has not restored. Found by listing ROOT/locks, never
    through the job dir (whose files the payload can write)."""
    try:
        names = sorted(os.listdir(locks_dir(root)))
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        if name.startswith(PREFIX) and name.endswith(".json"):
            entry = read_entry(root, name[len(PREFIX):-len(".json")])
            if entry and entry.get("job_id") == job_id:
                found.append(entry)
    return found


def clear(root: str, unit: str, job_id: str) -> bool:
    """After a finished restore: drop the entry if it still names job_id (an adopter's entry stays)."""
    entry = read_entry(root, unit)
    if not entry or entry.get("job_id") != job_id:
        return False
    try_unlink(ledger_path(root, unit))
    fsync_dir(locks_dir(root))
    return True
