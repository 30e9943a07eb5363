"""Who brings a stopped service back: one entry per restorer, each saying what it may assume.

    the supervisor    settle.settle on every path out of its run: it holds the job's locks, the record is its own
    the next job      adopt_stops: with the service's lock, before its own run; it adopts a stop that a dead job
                      of this login still owes (alive, that job would hold the lock)
    the guard         guard.cmd_guard: the supervisor gone or hung; it holds the supervisor's locks
    the guard timer   `restore` (cmd_restore), run by systemd at the job's longest bound
    ExecStopPost=     `restore` as the job's unit stops (restore_message says how the supervisor ended)
    a reap            `restore`, started detached by a read that finds supervisor and guard gone (verbs/reap.py)
    restore-service   cmd_restore_service: the manual lever; a job that released the unit's engine resumes it

Each but the supervisor settles under the job's restore lock (with_restore_lock) the job as owed.load_for_restore
reads it there; `restore` first takes the job's locks, deferring to a live supervisor or guard and to a job that
holds them (it adopted the stop).
"""
from __future__ import annotations

import fcntl
import json
import os
import signal
import time

from ...admission import describe_holder
from ...contract import RUNNING_SERVICE_STATES, job_id_problem, root_problem
from ...host import health
from ...host.answer import Fail
from ...host.processes import KILL_CONFIRM_S, POLL_S, identity, is_alive
from ...host.systemd import Systemd, start_unit
from .. import ledger, services
from ..budget import recorded
from ..files import JobPaths, is_slurm_job, read_json
from ..locks import Locks, flock_holders, restore_keys
from ..record import Job
from ..spec import check_health_url, check_unit, existing_job, job_paths
from ..unit import WATCHDOG_S
from . import owed
from .settle import bring_back_alone, kill_leftovers, settle_as_restorer, start_guard_timer, stop_guard_timer

# ── the next job on the service ───────────────────────────────────────────────────────────────────────

def adopt_stops(job: Job) -> None:
    """With the job's locks held, before anything of its own: adopt each stop of its services a dead job left
    owed (adopt_stop). Another login's owed stop is not ours: the job ends here, nothing touched."""
    for view in services.views(job):
        unit = view.status["service"]["unit"]
        entry = ledger.foreign_entry(job.paths.root, unit)
        if entry and view.ctl.is_active(unit) not in RUNNING_SERVICE_STATES:
            raise Fail("busy", "%s was stopped by %s and is not restored yet: that login's restorers bring it "
                       "back; nothing was stopped" % (unit, describe_holder(entry)))
    for view in services.views(job):
        adopt_stop(view)


def adopt_stop(job: Job) -> None:
    """With the service's lock held, an entry naming another job is a stop nobody will restore (alive, that
    job would hold the lock): we adopt it, restore it after our run, and settle the dead job as handed over.
    An entry whose service runs again is only dropped."""
    service = job.status["service"]
    entry = ledger.read_entry(job.paths.root, service["unit"])
    if not entry or ledger.same_job(entry, job.paths.root, job.paths.job_id):
        return
    unit, previous = service["unit"], entry.get("job_id")
    now = job.ctl.is_active(unit)
    if now in RUNNING_SERVICE_STATES and not entry.get("released"):  # a released engine runs but does not serve
        ledger.clear(entry.get("root", job.paths.root), unit, previous)
        job.event("ledger", unit=unit, dropped_from=previous, now=now,
                  message="%s was recorded as stopped by job %s but runs again: nothing to restore" % (unit, previous))
        return
    settle_adopted_from(job, entry)
    job.save(service=dict(service, was=entry.get("was") or "active", now=now, stopped=True,
                          stopped_at=entry.get("stopped_at") or time.time(), adopted_from=previous,
                          released=entry.get("released")))
    start_guard_timer(job, "adopted_timer_s")  # before this job's prepare step and staging
    ledger.record_stop(job.paths.root, unit, job.paths.job_id, job.status["service"], job.spec["gpu"]["devices"],
                       adopted_from=previous, stopped_at=job.status["service"]["stopped_at"],
                       released=entry.get("released"), service_gpus=job.spec["service"].get("gpus", []))
    job.event("ledger", unit=unit, adopted_from=previous, message="%s already stopped by job %s and not restored; "
              "job %s adopts it and will restore it" % (unit, previous, job.paths.job_id))


def settle_adopted_from(job: Job, entry: dict) -> None:
    """The dead job whose stop we adopt, settled under its restore lock (settle_as_handed_over)."""
    previous, root = entry.get("job_id"), entry.get("root", job.paths.root)
    if not previous or root_problem(root) or job_id_problem(previous):
        return
    paths = JobPaths(root, previous)
    if os.path.isdir(paths.dir):
        try:
            with_restore_lock(owed.load_for_restore(paths), lambda dead: settle_as_handed_over(dead, job))
        except Fail as exc:
            job.event("ledger", error="cannot settle job %s: %s" % (previous, exc))


def settle_as_handed_over(dead: Job, job: Job) -> None:
    """Kill the dead job's leftovers and record that `job` restores, unless it owes other stops too."""
    unit = job.status["service"]["unit"]
    if dead.status.get("restored"):
        return
    if [e for e in owed.stops_owed(dead.paths.root, dead.paths.job_id) if e["unit"] != unit]:
        dead.note_restore("job %s adopted the stop of %s; the job's other stops are still owed" % (job.paths.job_id, unit))
        return
    try:
        kill_leftovers(dead)
    except Exception as exc:  # its leftovers must not keep our job (and the service) waiting
        job.event("ledger", error="killing leftovers of %s: %s" % (dead.paths.job_id, exc))
    message = ("supervisor and guard died with the service stopped; job %s adopted the stop and restores it"
               % job.paths.job_id)
    dead.note_restore(message)
    dead.set_state(dead.status["state"] if dead.terminal else "LOST", "done", message=message, restored=True,
                   ended_at=dead.status.get("ended_at") or time.time(),
                   service=dict(dead.status["service"], handed_to=job.paths.job_id))
    stop_guard_timer(dead)


# ── `restore`: the guard timer, ExecStopPost=, a reap ─────────────────────────────────────────────────

def cmd_restore(args) -> dict:
    return restore_job(job_paths(args))


def restore_job(paths: JobPaths, only: str | None = None) -> dict:
    """`restore`: settle the job as a restorer once its supervisor and guard are gone, under its locks and its
    restore lock. Idempotent: a settled job is `already`; a live supervisor or guard, or a job holding the
    locks, `deferred`. With `only` (a unit), that unit alone, under its lock alone, when others are owed too."""
    job = owed.load_for_restore(paths)  # the ledger over status.json, which the payload can write
    if job.status.get("restored") or is_slurm_job(paths):  # Slurm's: no service, its processes on another node
        return answer(job, already=True)
    take_over_hung_restorer(job)  # a restorer (the guard too) past its bound: never deferred to forever
    entries = owed.stops_owed(paths.root, paths.job_id)
    if owed.job_alive(paths.root, paths.job_id, job.status, entries):
        return answer(job, deferred=True,
                      message="the job's supervisor (or guard) is alive and restores the service itself")
    if only and [e for e in entries if e["unit"] != only]:  # the job's other stops stay owed to its restorers
        keys, act = ["service-" + only], lambda job: bring_back_alone(job, only)
    else:
        message = restore_message(job)
        keys, act = restore_keys(job.spec), lambda job: settle_as_restorer(job, message)
    locks = Locks(paths.root, keys, paths.job_id)
    holder = locks.try_acquire()
    if holder is not None:
        return answer(job, deferred=True, message="%s is held by job %s, which settles this job's stop" % (
            holder.get("key"), holder.get("job_id", "?")))
    try:
        locks.write_holders()
        settled = with_restore_lock(job, act)
    finally:
        locks.release()
    return answer(settled or job, in_progress=settled is None)  # None: another restorer is at it


def restore_message(job: Job) -> str:
    """Who settled the job: `restore`, and under ExecStopPost= (SERVICE_RESULT) how the supervisor's unit
    ended; a job rebuilt from the ledger keeps why."""
    message = "supervisor gone; restored by `restore`" if job.status["state"] != "LOST" else job.status["message"]
    result, unit_message = os.environ.get("SERVICE_RESULT"), None
    if result:
        why = {"watchdog": "stopped answering systemd's watchdog for %d s (hung); systemd killed it" % WATCHDOG_S,
               "timeout": "ran past its unit's hard deadline (RuntimeMaxSec=); systemd killed it"}.get(
            result, "ended (%s, %s)" % (result, os.environ.get("EXIT_STATUS", "?")))
        unit_message = "the supervisor %s; the unit's ExecStopPost= restored the service" % why
    if job.status.get("phase") == owed.LEDGER_PHASE:
        return "; ".join(m for m in (message, unit_message) if m)
    return unit_message or message


def answer(job: Job, **extra) -> dict:
    """`restore`'s answer: the job's state and its service record, and its `services` when it freed several."""
    parts = {k: job.status[k] for k in ("service", "services") if k in job.status}
    return dict({"ok": True, "job_id": job.paths.job_id, "state": job.status["state"]}, **parts, **extra)


# ── restore-service ───────────────────────────────────────────────────────────────────────────────────

def cmd_restore_service(args) -> dict:
    """`restore-service`, the manual lever: start the unit unless it runs, wait at most --max-wait until
    healthy; answers healthy, starting or failed (with the unit's log), `started` and `was`."""
    unit = check_unit(args.unit)
    check_health_url(args.health_url, "bad-args")
    ctl = Systemd(args.scope, args.sudo)
    deadline = time.monotonic() + max(0.0, args.max_wait)
    released = resume_released_by_job(args.root, unit)
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
    reply = {"ok": True, "unit": unit, "state": state, "active_state": shown["active_state"],
             "sub_state": shown["sub_state"], "log_tail": None, "released": released, "started": started, "was": was}
    if heard:
        reply["health_note"] = heard[-1]
    if state == "failed":
        reply["log_tail"] = ctl.log_tail(unit)
    return reply


def resume_released_by_job(root: str, unit: str):
    """A unit whose engine a job released: that job's `restore` resumes it (None otherwise)."""
    entry = ledger.read_entry(root, unit)
    if not entry or not entry.get("released") or not entry.get("job_id"):
        return None
    try:
        done = restore_job(existing_job(entry.get("root", root), entry["job_id"]), only=unit)
    except Fail as exc:
        return {"job_id": entry["job_id"], "deferred": False, "error": str(exc)}
    deferred = bool(done.get("deferred") or done.get("in_progress"))
    return {"job_id": entry["job_id"], "deferred": deferred, "message": done.get("message")}


# ── the restore lock every restorer but the supervisor takes ──────────────────────────────────────────

def with_restore_lock(job: Job, act):
    """act(the job read again under its restore lock); that job, or None when another restorer holds it. The
    holder records itself and its bound (timeout_stop_s) for take_over_hung_restorer."""
    # payload.user reaches the job dir by name: a lock file it could open, it could flock against every restorer
    mode = 0o600 if job.spec["payload"].get("user") else 0o644
    fd = os.open(job.paths.restore_lock, os.O_RDWR | os.O_CREAT, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    try:
        until = time.time() + recorded(job.spec, job.status)["timeout_stop_s"]
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(dict(identity(os.getpid()), until=until)).encode())
        again = owed.load_for_restore(job.paths)
        act(again)
        return again
    finally:
        os.close(fd)


def take_over_hung_restorer(job: Job) -> bool:
    """SIGKILL the restorer holding the job's restore lock past its bound; True once gone. Its record is
    believed only for a process /proc/locks shows holding that very lock."""
    try:
        holder = read_json(job.paths.restore_lock)  # the payload's to replace: never a blocking open
        info = os.stat(job.paths.restore_lock)
    except (OSError, ValueError):
        return False
    until = holder.get("until") if isinstance(holder, dict) else None
    if (not isinstance(until, (int, float)) or time.time() <= until or not is_alive(holder)
            or int(holder["pid"]) not in flock_holders(info)):
        return False
    try:
        os.kill(int(holder["pid"]), signal.SIGKILL)
    except OSError:
        return False  # another user's (root's guard timer): not ours to end
    job.note_restore("restorer pid %d held the restore lock past its bound (hung): killed, taken over"
                     % int(holder["pid"]))
    deadline = time.monotonic() + KILL_CONFIRM_S
    while is_alive(holder) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return not is_alive(holder)
