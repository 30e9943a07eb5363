"""`restore` (settle a job whose supervisor and guard are gone, under its locks and restore lock) and
`restore-service` (the manual lever; it first lets a job that released the unit's engine resume it)."""
from __future__ import annotations

import time

from ..contract import RUNNING_SERVICE_STATES
from ..host import health
from ..host.answer import Fail
from ..host.systemd import Systemd, start_unit
from . import ledger, trust
from . import unit as job_unit
from .files import JobPaths, is_slurm_job
from .locks import Locks, restore_keys
from .record import Job
from .settle import restore_unit, settle_as_restorer, take_over_hung_restorer, with_restore_lock
from .spec import check_health_url, check_unit, existing_job, job_paths


def cmd_restore(args) -> dict:
    return restore_job(job_paths(args))


def restore_job(paths: JobPaths, only: str | None = None) -> dict:
    """`restore` of a job: settle it as a restorer when its supervisor and guard are both gone. Idempotent:
    a settled job is reported as is (`already`); a live supervisor or guard is left to do it (`deferred`).
    With `only` (a unit), resume that unit alone when the job owes others too."""
    job = trust.load_for_restore(paths)  # the ledger over status.json, which the payload can write
    answer = {"ok": True, "job_id": paths.job_id}
    if job.status.get("restored"):
        return dict(answer, state=job.status["state"], **service_parts(job.status), already=True)
    if is_slurm_job(paths):  # no service, and its processes live on a compute node, not here
        return dict(answer, state=job.status["state"], **service_parts(job.status), already=True)
    if take_over_hung_restorer(job):  # a restorer (the guard too) past its bound: never deferred to forever
        job = trust.load_for_restore(paths)
    if trust.job_alive(paths.root, paths.job_id, job.status, trust.owed(paths.root, paths.job_id)):
        return dict(answer, state=job.status["state"], **service_parts(job.status), deferred=True,
                    message="the job's supervisor (or guard) is alive and restores the service itself")
    message = "supervisor gone; restored by `restore`" if job.status["state"] != "LOST" else job.status["message"]
    unit_message = job_unit.stop_post_message()
    if job.status.get("phase") == trust.LEDGER_PHASE:  # rebuilt from the ledger: keep why, whoever runs us
        message = "; ".join(m for m in (message, unit_message) if m)
    else:
        message = unit_message or message
    if only and [e for e in trust.owed(paths.root, paths.job_id) if e["unit"] != only]:
        # U alone, under U's lock; the job's other stops stay owed to its restorers
        return restore_held(paths, job, ["service-" + only], answer,
                            lambda: restore_unit(trust.load_for_restore(paths), only))
    return restore_held(paths, job, restore_keys(job.spec), answer,
                        lambda: settle_as_restorer(trust.load_for_restore(paths), message))


def restore_held(paths: JobPaths, job: Job, keys: list, answer: dict, act) -> dict:
    """`act` (a restore, True when finished) under the locks `keys` and the job's restore lock. A restorer acts
    only while holding them: a job that holds one now runs on this service and settles our stop through the
    host ledger (it adopts it); starting the service here would be under its run. No other user can hold one of
    ours: the lock files are their taker's alone (locks.py)."""
    locks = Locks(paths.root, keys, paths.job_id)
    holder = locks.try_acquire()
    if holder is not None:
        return dict(answer, state=job.status["state"], **service_parts(job.status), deferred=True,
                    message="%s is held by job %s, which settles this job's stop" % (holder.get("key"),
                                                                                    holder.get("job_id", "?")))
    try:
        locks.write_holders()
        done = with_restore_lock(job, act)
    finally:
        locks.release()
    job = trust.load_for_restore(paths)
    return dict(answer, state=job.status["state"], **service_parts(job.status), in_progress=not done)


def service_parts(status: dict) -> dict:
    """A status's service record, and its `services` when the job freed several."""
    return {k: status[k] for k in ("service", "services") if k in status}


def cmd_restore_service(args) -> dict:
    """`restore-service`: the manual lever, no job involved. Start the unit unless it runs, then wait (at
    most --max-wait) until healthy; answers healthy, starting or failed (with the unit's log), whether it
    started the unit and the state it found (`started`, `was`)."""
    unit = check_unit(args.unit)
    check_health_url(args.health_url, "bad-args")
    ctl = Systemd(args.scope, args.sudo)
    deadline = time.monotonic() + max(0.0, args.max_wait)
    released = restore_released_by_job(args.root, unit)
    was = ctl.show(unit)["active_state"]
    ctl.refuse_missing(unit, was)
    started = was not in RUNNING_SERVICE_STATES
    if started:
        start_unit(ctl, unit, deadline - time.monotonic())
    heard = []  # type: list
    healthy, active = health.wait_healthy(ctl, unit, args.health_url, deadline - time.monotonic(), heard.append)
    shown = ctl.show(unit)
    state = "healthy" if healthy else ("starting" if shown["active_state"] in RUNNING_SERVICE_STATES else "failed")
    if released and released.get("deferred"):  # it runs and answers, but its memory is still released
        state = "starting"
    answer = {"ok": True, "unit": unit, "state": state, "active_state": shown["active_state"],
              "sub_state": shown["sub_state"], "log_tail": None, "released": released, "started": started,
              "was": was}
    if heard:
        answer["health_note"] = heard[-1]
    if state == "failed":
        answer["log_tail"] = ctl.log_tail(unit)
    return answer


def restore_released_by_job(root: str, unit: str):
    """A unit whose engine a job released (the ledger says which): that job's own `restore` resumes it, under
    its locks (deferred while its supervisor or guard lives, or another job holds them). None otherwise."""
    entry = ledger.read_entry(root, unit)
    if not entry or not entry.get("released") or not entry.get("job_id"):
        return None
    try:
        done = restore_job(existing_job(entry.get("root", root), entry["job_id"]), only=unit)
    except Fail as exc:
        return {"job_id": entry["job_id"], "deferred": False, "error": str(exc)}
    # another restorer at work (within its bound) has not resumed it yet either
    deferred = bool(done.get("deferred") or done.get("in_progress"))
    return {"job_id": entry["job_id"], "deferred": deferred, "message": done.get("message")}
