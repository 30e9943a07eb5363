"""What a job owes, and what its restorers believe: the host ledger over status.json.

The payload can overwrite its job's status.json and spec.json (garbage, or a forged "SUCCEEDED, restored");
the ledger (supervision/ledger.py) it is not told of. Whether a stop is owed is the ledger's alone (stops_owed,
owes), whether the job's supervisor or guard lives its service lock's (job_alive); a restorer settles the job
load_for_restore reads: status.json where the ledger agrees, else one rebuilt from the ledger. A payload of the
same user can still delete the ledger or kill the restorers; payload.user runs it as another user, who cannot.
`status` loads this room: the record and services rooms are imported only where it settles.
"""
from __future__ import annotations

import time

from ...contract import DEFAULTS, RUNNING_SERVICE_STATES, SERVICE_SCOPES, TERMINAL, normalize_unit, unit_problem
from ...host.answer import Fail
from ...host.processes import is_alive
from .. import ledger
from ..files import JobPaths, read_json, read_status, write_json_atomic
from ..locks import lock_held, read_holder

TYPE_CHECKING = False  # typing itself is not imported: a `status` call would pay for it
if TYPE_CHECKING:
    from ..record import Job


LEDGER_PHASE = "settling from the host ledger"


def stops_owed(root: str, job_id: str) -> list:
    """The ledger's entries naming job_id whose unit is a valid name (an entry is data, not code either)."""
    entries = ledger.entries_of(root, job_id)
    return [e for e in entries if isinstance(e.get("unit"), str) and not unit_problem(e["unit"])]


def contradiction(status: dict, entries: list):
    """Why `status` is not believed, or None: it says SUCCEEDED, or restored, while the ledger owes a stop."""
    entries = [e for e in entries if not e.get("restore_failed_at")]  # tried: the job's end stands as recorded
    if not entries or status.get("state") not in TERMINAL:
        return None
    if status.get("state") != "SUCCEEDED" and not status.get("restored"):
        return None  # e.g. LOST by a reap, its restore still to come: what the ledger says too
    return ("status.json says %s%s, but the host ledger says this job stopped %s and has not restored it"
            % (status.get("state"), " and restored" if status.get("restored") else "", entries[0]["unit"]))


def holds_locks(root: str, job_id: str, entries: list) -> bool:
    """The job's supervisor or guard holds one of its service locks (its holder record names it or is unreadable)."""
    for entry in entries:
        key = "service-" + entry["unit"]
        holder = read_holder(key) or {}
        if lock_held(key) and (holder.get("job_id"), holder.get("root", root)) in ((job_id, root), (None, root)):
            return True
    return False


def job_alive(root: str, job_id: str, status: dict, entries: list) -> bool:
    """Whether the job's supervisor or guard lives: with a stop owed the service lock says (a pid forged in
    status.json would keep every restorer waiting); with none, status.json's identities."""
    if entries:
        return holds_locks(root, job_id, entries)
    return is_alive(status.get("supervisor")) or is_alive(status.get("guard"))


def load_for_restore(paths: JobPaths) -> Job:
    """The job as a restorer must settle it: rebuilt from the ledger (LOST, its units stopped and owed) when
    status.json or spec.json is unreadable or contradicted; `bad-status` when neither can say."""
    from .. import services
    from ..record import Job

    entries = stops_owed(paths.root, paths.job_id)
    spec = readable_spec(paths)
    try:
        status = read_status(paths)
        why = contradiction(status, entries)
    except Fail as exc:
        if not entries:
            raise
        status, why = None, "status.json cannot be read (%s)" % exc
    if why is None and entries and not {e["unit"] for e in entries} <= set(services.units(spec or {"service": {}})):
        why = "spec.json does not name the units the host ledger says this job stopped"
    if why is None and spec is not None and status is not None:  # status is None only with a why
        return Job(paths, spec, with_noted_processes(status, entries))
    if not entries:
        raise Fail("bad-status", "cannot read %s" % paths.spec, job_id=paths.job_id)
    rebuilt = spec_from_ledger(paths.job_id, entries)
    if spec is None:
        write_json_atomic(paths.spec, rebuilt)  # so later calls (status, restore) can read the job again
    return Job(paths, rebuilt, status_from_ledger(rebuilt, entries, why or "spec.json cannot be read"))


def readable_spec(paths: JobPaths):
    try:
        spec = read_json(paths.spec)
    except (OSError, ValueError):
        return None
    ok = isinstance(spec, dict) and all(isinstance(spec.get(k), dict) for k in ("service", "gpu", "limits"))
    return spec if ok else None


def spec_from_ledger(job_id: str, entries: list) -> dict:
    """Enough of a spec to restore the entries' units: what the supervisor recorded before each stop."""
    sections = [service_from_ledger(entry) for entry in entries]
    gpus = [str(g) for g in entries[0].get("gpus") or [] if isinstance(g, (str, int))]
    spec = {"name": job_id, "job_id": job_id, "service": sections[0],
            "gpu": {"devices": gpus, "required_mib": 0, "drain_timeout": DEFAULTS["gpu.drain_timeout"]},
            "payload": {"command": ["true"], "script": None, "python": None, "args": [], "env": {}, "prepare": None},
            "limits": {"max_runtime": DEFAULTS["limits.max_runtime"], "grace": DEFAULTS["limits.grace"],
                       "prepare_timeout": DEFAULTS["limits.prepare_timeout"],
                       "queue_timeout": DEFAULTS["limits.queue_timeout"], "max_downtime": None}}
    if len(sections) > 1:
        spec["services"] = sections
    return spec


def service_from_ledger(entry: dict) -> dict:
    scope = entry.get("scope") if entry.get("scope") in SERVICE_SCOPES else DEFAULTS["service.scope"]
    url = entry.get("health_url")
    timeout = entry.get("health_timeout")
    service = {"manager": "systemd", "unit": normalize_unit(entry["unit"]), "scope": scope,
               "sudo": entry.get("sudo") is True, "stop": "always",
               "health_url": url if isinstance(url, str) and url.startswith(("http://", "https://")) else None,
               "health_timeout": float(timeout) if isinstance(timeout, (int, float)) and timeout > 0
               else DEFAULTS["service.health_timeout"]}
    held = [str(g) for g in entry.get("service_gpus") or [] if isinstance(g, (str, int))]
    return dict(service, gpus=held) if held else service


def status_from_ledger(spec: dict, entries: list, why: str) -> dict:
    """A status that says what the ledger knows: this job stopped the entries' units and owes their restore."""
    from .. import services
    from ..record import initial_status

    status = initial_status(spec)
    stopped = [dict(record, was=entry.get("was") if entry.get("was") in RUNNING_SERVICE_STATES else "active",
                    stopped=True, stopped_at=entry.get("stopped_at") if isinstance(entry.get("stopped_at"), (int, float))
                    else time.time()) for record, entry in zip(services.records(status), entries)]
    payload, slots = noted_processes(entries)
    status.update(state="LOST", phase=LEDGER_PHASE, ended_at=time.time(),
                  message="%s; settled from the host ledger (the payload may have overwritten its job's files)" % why,
                  service=stopped[0], payload=payload, slots=slots, **({"services": stopped} if len(stopped) > 1 else {}))
    return status


def noted_processes(entries: list) -> tuple:
    """(the payload, the busy slots' processes) as the supervisor noted them in the ledger entries."""
    payload = next((p for p in (payload_from_ledger(entry.get("payload")) for entry in entries) if p), None)
    noted = [slot for entry in entries if isinstance(entry.get("slots"), list) for slot in entry["slots"]]
    slots = list({p["pid"]: p for p in map(payload_from_ledger, noted) if p}.values())  # each entry may name them
    return payload, slots


def with_noted_processes(status: dict, entries: list) -> dict:
    """status.json with the processes a restorer kills (as root) taken from the ledger: a pid forged in the
    record with a live process's start time would pass the start-time check."""
    payload, slots = noted_processes(entries)
    if payload is None:
        return status
    recorded = status.get("payload")
    if not isinstance(recorded, dict):
        recorded = payload
    return dict(status, payload=dict(recorded, **ledger.ident(payload)), slots=slots)


def payload_from_ledger(payload):
    """A payload process the supervisor noted in the ledger, as kill_leftovers takes it; None if malformed."""
    if not isinstance(payload, dict):
        return None
    ident = ledger.ident(payload)
    ints = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in ident.values())
    return dict(ident, exit_code=None, signal=None, started_at=None) if ints else None


def stopped_by_us(service: dict) -> bool:
    """We stopped a service that was running: it must be restored."""
    return bool(service.get("stopped")) and service.get("was") in RUNNING_SERVICE_STATES


def owes(job: Job) -> bool:
    """Whether the job still owes its service's restore: the ledger's word alone, whose account of the stop
    replaces the record's. An entry naming another job is a stop it adopted (`handed_to`)."""
    service = job.status["service"]
    entry = ledger.read_entry(job.paths.root, service["unit"])
    if not ledger.same_job(entry, job.paths.root, job.paths.job_id):
        if entry and entry.get("job_id") is not None and stopped_by_us(service):
            job.note_restore("job %s adopted the stop of %s; it restores the service" % (entry["job_id"], entry["unit"]))
            job.save(service=dict(service, handed_to=entry["job_id"]))
        return False
    if entry.get("was") not in RUNNING_SERVICE_STATES:
        return False
    stopped_at = service.get("stopped_at") if stopped_by_us(service) else entry.get("stopped_at")
    job.save(service=dict(service, stopped=True, was=entry["was"], released=entry.get("released"),
                          stopped_at=stopped_at if isinstance(stopped_at, (int, float)) else time.time()))
    return True
