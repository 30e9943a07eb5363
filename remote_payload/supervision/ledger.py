"""The host ledger: "service S (on GPUs G) was stopped by job J and is not restored yet".

One JSON file per service beside the locks (H/runner-ledger-service-<unit>.json), whatever the job's host.root
(the entry names it), written before the stop and removed only by a restorer that saw the unit back (a failed
restore marks it tried), so it outlives every process of the job: the next job on that service learns the
service is down because of J. Whoever holds the service's lock settles an entry naming another job: it adopts
the stop, or finds the service running again and drops the entry.

An entry is acted on only by the login that wrote it (the file's owner, `read_entry`): another login's is
`foreign_entry`, and a unit it names that is not running is busy for everyone else (preflight).
"""
from __future__ import annotations

import json
import os
import time

from .files import fsync_dir, open_regular, read_json, stamp, try_unlink, write_json_atomic
from .locks import PREFIX as LOCKS_PREFIX
from .locks import lock_dir, user_name

PREFIX = LOCKS_PREFIX + "ledger-service-"


def ledger_path(unit: str) -> str:
    return os.path.join(lock_dir(), "%s%s.json" % (PREFIX, unit))


def owner(unit: str):
    """The uid of unit's entry file (the login that wrote it), or None when there is none."""
    try:
        return os.lstat(ledger_path(unit)).st_uid
    except FileNotFoundError:
        return None


def acting_for(root: str) -> set:
    """Whose entries this process acts on: its own and, as root, the login's whose host.root it is."""
    try:
        return {os.geteuid()} | ({os.stat(root).st_uid} if os.geteuid() == 0 else set())
    except OSError:
        return {os.geteuid()}


def read_entry(root: str, unit: str):
    """This login's entry for `unit`, or None; an unreadable one of ours still means "stopped by someone"."""
    if owner(unit) not in acting_for(root):
        return None
    try:
        with open_regular(ledger_path(unit)) as fh:
            entry = json.loads(fh.read(1 << 20).decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"unit": unit, "job_id": None, "root": root, "was": "active", "stopped_at": None, "unreadable": True}
    return entry if isinstance(entry, dict) else None


def foreign_entry(root: str, unit: str):
    """Another login's entry for `unit` ({job_id, stopped_at, root, unit, user}), or None: only ever named."""
    uid = owner(unit)
    if uid is None or uid in acting_for(root):
        return None
    try:
        entry = read_json(ledger_path(unit))
    except (OSError, ValueError):
        entry = {}
    entry = entry if isinstance(entry, dict) else {}
    return dict({k: entry.get(k) for k in ("job_id", "stopped_at", "root")}, unit=unit, user=user_name(uid))


def same_job(entry, root: str, job_id) -> bool:
    """The entry names the job job_id of host.root `root` (an entry without `root` is of `root`)."""
    return bool(entry) and entry.get("job_id") == job_id and entry.get("root", root) == root


def write_entry(root: str, unit: str, entry: dict) -> None:
    """An entry is the file of the login whose host.root it names (root's guard timer gives it back)."""
    write_json_atomic(ledger_path(unit), entry, 0o644)
    uid = os.stat(root).st_uid
    if os.geteuid() == 0 and uid != 0:
        os.chown(ledger_path(unit), uid, -1)


def record_stop(root: str, unit: str, job_id: str, service: dict, gpus: list, **extra) -> None:
    """Before the stop: the host now knows job_id is about to stop unit and owes it a restore."""
    write_entry(root, unit, dict({
        "unit": unit, "job_id": job_id, "root": root, "was": service.get("was"), "scope": service.get("scope"),
        "sudo": service.get("sudo"), "health_url": service.get("health_url"),
        "health_timeout": service.get("health_timeout"), "gpus": list(gpus), "stopped_at": time.time(), **stamp()},
        **extra))


def note(root: str, unit: str, job_id: str, **fields) -> None:
    """fields into job_id's entry for unit: `payload` (the process running under the stop) and `slots` (a
    sweep's busy slots' processes), each an ident, for a restorer that cannot trust status.json;
    `restore_failed_at` (a restore ran, the unit did not come back healthy: still owed, tried)."""
    entry = read_entry(root, unit)
    if same_job(entry, root, job_id) and not entry.get("unreadable"):
        write_entry(root, unit, dict(entry, **fields))


def ident(payload: dict) -> dict:
    return {k: payload.get(k) for k in ("pid", "pgid", "start_time")}


def entries(root: str) -> list:
    """This login's entries, found by listing H, never through a job dir (the payload's to write)."""
    names = sorted(os.listdir(lock_dir()))
    units = [n[len(PREFIX):-len(".json")] for n in names if n.startswith(PREFIX) and n.endswith(".json")]
    found = [read_entry(root, unit) for unit in units]
    return [entry for entry in found if entry]


def entries_of(root: str, job_id: str) -> list:
    """Every entry naming job_id of host.root `root`: the stops it made and has not restored."""
    return [entry for entry in entries(root) if same_job(entry, root, job_id)]


def clear(root: str, unit: str, job_id: str) -> bool:
    """After a finished restore: drop the entry if it still names job_id (an adopter's entry stays)."""
    if not same_job(read_entry(root, unit), root, job_id):
        return False
    try_unlink(ledger_path(unit))
    fsync_dir(lock_dir())
    return True
