"""One job's choreography on the host: everything between "supervisor started" and "settle".

    supervise: locks → adopt the ledger's stops → may it start (startable.py) → prepare step → stage the
               payload (stage.py) → record the service → stop it, or release its GPU memory through the
               engine's API (service.free) → drain GPU memory → run its variants (variants.py) → settle,
               on every path out
"""
from __future__ import annotations

import os
import time

from ..admission import needs_stop
from ..contract import RUNNING_SERVICE_STATES
from ..host import engine, unit_stop
from ..host.answer import Fail
from ..host.gpu import describe_apps, query_apps, query_gpus, refuse_too_small, short_gpus
from ..host.processes import kill_group
from . import ledger, services, stage, variants
from .budget import STOP_TIMEOUT_S
from .files import try_unlink
from .locks import Locks
from .payload import check_interrupt, launch_payload, payload_argv, watch_prepare
from .record import Flags, Interrupted, Job
from .restore.restorers import adopt_stops
from .restore.settle import GPU_POLL_S, settle, start_guard_timer
from .startable import check_startable

LOCK_POLL_S = 0.5


def wait_for_locks(job: Job, locks: Locks, flags: Flags) -> None:
    """--queue: wait for the locks, at most limits.queue_timeout; past it the job ends TIMED_OUT, nothing touched."""
    bound = job.spec["limits"]["queue_timeout"]
    job.set_state("QUEUED", "waiting for locks: %s (at most %.0f s)" % (", ".join(locks.keys), bound))
    deadline = time.monotonic() + bound
    while True:
        holder = locks.try_acquire()
        if holder is None:
            return
        check_interrupt(job, flags)
        if time.monotonic() >= deadline:
            who = "job %s" % holder["job_id"] if holder.get("job_id") else "another process"
            raise Interrupted("TIMED_OUT", "waited %.0f s (limits.queue_timeout) for %s, held by %s; gave up with "
                              "nothing stopped" % (bound, holder.get("key", "the locks"), who))
        time.sleep(LOCK_POLL_S)


def prepare_service(job: Job, flags: Flags) -> None:
    """Record each of the job's services' state (those its GPUs meet: spec.select_services); stop (or release)
    each one the policy says, decided here on the host."""
    for view in services.views(job):
        prepare_one(view, flags)


def prepare_one(view, flags: Flags) -> None:
    service = view.status["service"]
    if service.get("adopted_from"):
        return  # adopted: already stopped, recorded from the ledger, ours to restore
    before = view.ctl.show(service["unit"])
    view.save(service=dict(service, was=before["active_state"], now=before["active_state"]))
    view.event("service", unit=service["unit"], **before)
    if before["active_state"] in RUNNING_SERVICE_STATES and should_stop(view):
        check_interrupt(view, flags)
        (stop_service if view.spec["service"].get("free", "stop") == "stop" else release_service)(view)


def measure_gpus(job: Job) -> list:
    """The job's cards before the stop; one smaller than the need fails the job here (no stop helps)."""
    gpu = job.spec["gpu"]
    if not gpu["devices"]:
        return []
    gpus = query_gpus(gpu["devices"])
    job.save(gpu=dict(job.status["gpu"], before=gpus))
    refuse_too_small(gpus, gpu["required_mib"])
    return gpus


def should_stop(job: Job) -> bool:
    """The policy over the job's GPUs that this service holds (all of the job's when it names none)."""
    policy = job.spec["service"]["stop"]
    if policy == "never":
        return False
    held = job.spec["service"].get("gpus")
    gpus = [g for g in measure_gpus(job) if not held or g["index"] in held or g["uuid"] in held]
    return needs_stop(policy, bool(short_gpus(gpus, job.spec["gpu"]["required_mib"])))  # admission's rule


def record_stop(job: Job, **extra) -> None:
    """The ledger entry of this service's stop, with the staged payload already waiting for the GPU (from
    this supervisor's memory, not status.json, which that payload can write)."""
    staged = job.status.get("payload") or {}
    if staged.get("pid") in job.payload_pids and staged.get("exit_code") is None and staged.get("signal") is None:
        extra.setdefault("payload", ledger.ident(staged))
    ledger.record_stop(job.paths.root, job.spec["service"]["unit"], job.paths.job_id, job.status["service"],
                       job.spec["gpu"]["devices"], service_gpus=job.spec["service"].get("gpus", []), **extra)


def stop_service(job: Job) -> None:
    unit = job.spec["service"]["unit"]
    start_guard_timer(job)
    # In the host ledger and marked stopped before asking, so every restore path (and the next job on this
    # service, when all of ours are dead) brings it back even if we die mid-stop.
    record_stop(job)
    job.set_state("STOPPING_SERVICE", "stopping " + unit,
                  service=dict(job.status["service"], stopped=True, stopped_at=time.time()))
    try:
        job.ctl.change("stop", unit, timeout=STOP_TIMEOUT_S)
    except Fail:
        if job.ctl.is_active(unit) in RUNNING_SERVICE_STATES:  # it still runs: nothing to restore
            job.save(service=dict(job.status["service"], stopped=False, stopped_at=None))
        raise
    freed_at = time.time()
    now = job.ctl.is_active(unit)
    failed = {"stop_result": unit_stop.failed_by_stop(job.ctl, unit)} if now == "failed" else {}
    if failed:  # the engine's own shutdown under our SIGTERM, not a service problem: said, and cleared at restore
        job.event("service", unit=unit, **failed)
    job.save(service=dict(job.status["service"], now=now, freed_at=freed_at, **failed))


def release_service(job: Job) -> None:
    """Free the GPU through the engine's API (service.free); the unit keeps running. Recorded like a stop,
    again at every step, so every restorer knows what to resume."""
    spec_service, unit = job.spec["service"], job.spec["service"]["unit"]
    offers = engine.probe(spec_service, time.monotonic() + engine.CALL_TIMEOUT_S)
    start_guard_timer(job)
    stopped_at = time.time()

    def keep(record: dict) -> None:
        record_stop(job, released=record, stopped_at=stopped_at)
        job.save(service=dict(job.status["service"], released=record))

    record = engine.new_record(spec_service, offers)
    keep(record)
    job.set_state("STOPPING_SERVICE", "freeing GPU memory through the %s %s API of %s (%s)" % (
        spec_service["free"], offers["version"], unit, how_it_frees(record)),
        service=dict(job.status["service"], stopped=True, stopped_at=stopped_at))
    try:
        record = engine.release(spec_service, job.spec["gpu"]["required_mib"], lambda: least_free(job),
                                time.monotonic() + STOP_TIMEOUT_S, keep, offers)
    except engine.NothingReleased:  # nothing released, nothing left paused, the engine serving: nothing to restore
        ledger.clear(job.paths.root, unit, job.paths.job_id)  # the ledger is what every restorer trusts
        job.save(service=dict(job.status["service"], stopped=False, stopped_at=None))
        raise
    # Its clients were served until the pause that held (a drain waits before it): the window starts there.
    job.save(service=dict(job.status["service"], freed_at=time.time(),
                          stopped_at=record.get("paused_at") or stopped_at))
    job.event("service", released=record["steps"], message=engine.describe(record), clients=record.get("clients"),
              drain=record.get("drain"))


def how_it_frees(record: dict) -> str:
    if record["engine"] == "vllm":
        return "asleep once its requests in flight have finished"
    return {"retract": "its requests held, none aborted", "drain": "once its requests in flight have finished",
            "abort": "its requests in flight aborted"}[record["mode"]]


def least_free(job: Job):
    """The least free MiB over the job's GPUs (None when nvidia-smi cannot say); 0 MiB needed without GPUs."""
    devices = job.spec["gpu"]["devices"]
    frees = [g["free_mib"] for g in query_gpus(devices)] if devices else [0]
    return None if None in frees else min(frees)


def drain(job: Job, flags: Flags) -> None:
    """Wait until every job GPU shows required_mib free; on timeout name who still holds memory."""
    gpu = job.spec["gpu"]
    if not gpu["devices"]:
        return
    need = gpu["required_mib"]
    job.set_state("DRAINING", "waiting for %d MiB free on GPU %s" % (need, ",".join(gpu["devices"])))
    started = time.monotonic()
    while True:
        gpus = query_gpus(gpu["devices"])
        refuse_too_small(gpus, need)
        short = short_gpus(gpus, need)
        if not short:
            job.save(gpu=dict(job.status["gpu"], drained_after_s=round(time.monotonic() - started, 3)))
            job.event("gpu", phase="drained", gpus=gpus)
            return
        check_interrupt(job, flags)
        if time.monotonic() - started >= gpu["drain_timeout"]:
            raise Fail("drain-timeout", drain_message(short, need, gpu["drain_timeout"], query_apps()))
        time.sleep(GPU_POLL_S)


def drain_message(short: list, need: int, waited: float, apps: list) -> str:
    gaps = "; ".join("GPU %s: %s MiB free < %d MiB needed" % (g["index"], g["free_mib"], need) for g in short)
    return "%s after waiting %.0f s; memory is held by %s" % (gaps, waited, describe_apps(apps))


def prepare_argv(spec: dict):
    prepare = spec["payload"].get("prepare")
    return None if prepare is None else payload_argv(spec, prepare)


def run_prepare_step(job: Job, flags: Flags) -> None:
    """The payload's prepare step (e.g. a JIT compile), bounded by limits.prepare_timeout, before the service
    is touched: if it fails, the job fails with the service never stopped."""
    argv = prepare_argv(job.spec)
    if argv is None:
        return
    check_interrupt(job, flags)
    began = time.monotonic()
    job.event("prepare", status="start", argv=argv)
    proc = launch_payload(job, argv, "PREPARING", "prepare step running (the service is untouched)",
                          result=job.paths.prepare_result)
    stop = watch_prepare(job, proc, flags)
    kill_group(proc.pid, job.spec["limits"]["grace"], proc)
    code = proc.wait()
    set_aside_prepare_result(job.paths)
    job.event("prepare", status="end", exit_code=code, seconds=round(time.monotonic() - began, 3))
    job.save(prepare={"exit_code": code, "seconds": round(time.monotonic() - began, 3)})
    if stop is not None:
        raise Interrupted("FAILED" if stop[0] == "TIMED_OUT" else stop[0], stop[1] + "; the service was not stopped")
    if code != 0:
        raise Fail("internal", "the prepare step exited with code %d; the service was not stopped" % code)


def set_aside_prepare_result(paths) -> None:
    """A result.json the prepare step wrote goes to prepare-result.json: result.json is the payload's."""
    if not os.path.lexists(paths.result):
        return
    if os.path.lexists(paths.prepare_result):
        try_unlink(paths.result)
    else:
        os.replace(paths.result, paths.prepare_result)


def supervise(job: Job, locks: Locks, flags: Flags) -> None:
    """The whole job; `settle` runs on every path out, exceptions included."""
    ending = None
    try:
        if not locks.held:
            wait_for_locks(job, locks, flags)
        locks.write_holders()
        adopt_stops(job)
        check_startable(job.spec, job.paths.root)  # again, with the locks held: a queued job starts later
        run_prepare_step(job, flags)
        measure_gpus(job)
        staged = stage.stage_payload(job, flags) if job.spec["payload"].get("staged") else None
        prepare_service(job, flags)
        drain(job, flags)
        variants.run_variants(job, flags, staged)  # a plain job's one, or a sweep's every variant, in this window
    except Interrupted as stop:
        ending = (stop.state, str(stop))
    except Fail as exc:
        ending = ("FAILED", str(exc))
    except Exception as exc:  # a bug here must still end in a restored host and a readable status
        import traceback  # here: not paid by every start

        traceback.print_exc()
        ending = ("FAILED", "supervisor error: %s: %s" % (type(exc).__name__, exc))
    finally:
        settle(job, ending)
        # Only after a finished restore: if settle raised, the guard's inherited lock fds keep the host
        # locked until it has restored the service (LOCK_UN would release its copies too).
        locks.release()
