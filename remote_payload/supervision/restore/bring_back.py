"""Bring a service back: start the unit a job stopped, or resume the engine it released (else restart the
unit), and wait until healthy; records how (service.resumed: api | restart | start) and service.downtime.
"""
from __future__ import annotations

import time

from ...host import engine, health, unit_stop
from ...host.answer import Fail
from ...host.http_client import EngineError
from ...host.systemd import start_unit
from ..record import Job


def bring_back(job: Job, since=None) -> None:
    """Start the service this job stopped (or resume its engine) and wait until healthy, within health_timeout
    from `since` (a job's services share one such bound)."""
    service = job.status["service"]
    unit, began = service["unit"], time.time()
    deadline = (time.monotonic() if since is None else since) + job.spec["service"]["health_timeout"]
    if service.get("released"):  # freed through the engine's API: resumed, the unit restarted if that fails
        healthy, now = resume_released(job, deadline)
    else:
        healthy, now = start_and_wait(job, unit, deadline)
    restored_at = time.time()
    service = job.status["service"]  # with what the restore recorded (service.resumed)
    job.save(service=dict(service, now=now, healthy=healthy, restored_at=restored_at,
                          downtime_s=round(restored_at - (service.get("stopped_at") or restored_at), 3),
                          downtime=engine.downtime(service, job.status.get("gpu"), began, restored_at, healthy)))
    job.note_restore("%s is %s, %s" % (unit, now, "healthy" if healthy else "NOT healthy"))


def start_and_wait(job: Job, unit: str, deadline: float, how: str = "start", began=None) -> tuple:
    """`systemctl start` (or `restart`: an engine its API did not resume) and the health wait; returns
    (healthy, active_state). resume_s counts from `began`."""
    began = time.monotonic() if began is None else began
    try:
        if how == "start":
            job.note_restore("starting %s" % unit)
            clear_failed_stop(job, unit)
            why = start_unit(job.ctl, unit, deadline - time.monotonic())
            if why:
                job.note_restore(why)
        else:
            job.ctl.change("restart", unit, timeout=max(0.5, deadline - time.monotonic()))
        started = time.monotonic()
        healthy, now = health.wait_healthy(job.ctl, unit, job.spec["service"].get("health_url"),
                                           deadline - started, job.note_restore)
    except Fail as exc:
        job.note_restore("%s %s failed: %s" % ("restoring" if how == "start" else "restarting", unit, exc))
        return False, "unknown"
    job.save(service=dict(job.status["service"], resumed={
        "how": how, "resume_s": round(started - began, 3), "health_s": round(time.monotonic() - started, 3)}))
    if how == "restart":
        job.note_restore("%s restarted (its engine was released and the API did not resume it)" % unit)
    return healthy, now


def resume_released(job: Job, deadline: float) -> tuple:
    """Resume a released engine through its API within half the time left, else restart the unit."""
    service = job.status["service"]
    unit, record = service["unit"], service["released"]
    job.note_restore("resuming %s: %s" % (unit, engine.describe(record)))
    began = time.monotonic()
    try:
        timings = engine.resume(record, job.spec["service"], began + (deadline - began) / 2)
    except Exception as exc:  # an EngineError, or a record it could not act on: the restart brings it back anyway
        job.note_restore("the %s API did not bring %s back (%s): restarting the unit" % (
            record.get("engine"), unit, exc if isinstance(exc, EngineError) else "%s: %s" % (type(exc).__name__, exc)))
        return start_and_wait(job, unit, deadline, "restart", began)
    job.save(service=dict(job.status["service"], resumed=dict(timings, how="api")))
    try:
        return True, job.ctl.is_active(unit)
    except Fail as exc:  # resumed, but systemctl could not say how the unit is
        return True, "unknown (%s)" % exc


def clear_failed_stop(job: Job, unit: str) -> None:
    """`reset-failed` before the start when our stop left the unit failed: not the service's failure."""
    stop_result = job.status["service"].get("stop_result")
    if not stop_result:
        return
    why = unit_stop.reset_failed(job.ctl, unit)
    job.note_restore(why or "%s was left failed by this job's stop (Result=%s): reset-failed before the start"
                     % (unit, stop_result.get("result")))


def start_without_waiting(job: Job) -> None:
    """`start --no-block` of a stopped unit, so several services' health waits overlap in one health_timeout."""
    if job.status["service"].get("released"):
        return  # resumed through its engine's API by bring_back itself
    try:
        job.ctl.change("start", job.status["service"]["unit"], "--no-block")
    except Fail as exc:
        job.note_restore("starting %s: %s" % (job.status["service"]["unit"], exc))
