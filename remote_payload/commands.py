"""The host side's subcommands, argv parsing and the one JSON answer per call (docs/protocol.md is binding).

supervisor.py, the entry script, calls `main` (BOOT imports it from ROOT/payload/<digest>/; the guard, the
guard timer, ExecStopPost= and a Slurm batch step run it by path). The rest lives in the package's rooms,
each importing only the layers below it (tests/test_import_layers.py HOST_LAYERS):

    contract.py, admission.py, progress.py, sweep.py, slurm/batch.py, slurm/states.py
                   the shared rules: pure, stdlib only; the controller imports them too
    host/          host primitives (Fail, bounded commands, systemd, nvidia-smi, /proc) and the engine's API
    supervision/   one job on one host: spec, files, record, ledger, trust, startable, payload, stage, variants,
                   budget, settle and the guard, the unit, start, job (the choreography), submit
    slurm/         launch, array, calls, allocation: `launcher: slurm` (imported on first use, below)
    commands.py    this file: the subcommands; nothing below imports it

Public subcommands: preflight, start, submit (preflight, verdict and start in one call), status, logs, cancel, restore,
restore-service, result, gc (the retention rule by hand).
Internal ones: _run (the detached supervisor of one job) and _guard (watches the supervisor; settles the job
if the supervisor dies without doing it).
`slurm-run` is what a Slurm batch script execs in its allocation (launcher slurm: slurm/launch.py, which
also submits, follows and cancels such jobs for start/status/logs/cancel).

    start ──systemd-run──▶ runner-job-<id>.service: _run (supervision/unit.py), or where systemd is not:
          ──fork/setsid/fork──▶ _run, this interpreter's own fork calling main (supervision/start.py)
      ◀── one JSON line: through ready.fifo (unit), over a pipe (fork) ──┘
    _run ──fork/setsid/exec supervisor.py _guard──▶ the guard (supervision/settle.py): holds the read end of
          the "life" pipe and the lock fds; EOF = the supervisor is gone

Process ids are trusted only together with their start time (/proc/PID/stat field 22), so a reused pid is
never taken for the job. Runs on Python >= 3.8 and never imports the controller.
"""
from __future__ import annotations

import argparse
import base64
import fcntl
import json
import os
import select
import shutil
import signal
import sys
import time

from .contract import DEFAULTS, MAX_RESULT_BYTES, RUNNING_SERVICE_STATES, SERVICE_SCOPES, TERMINAL, services_of
from .supervision.files import JobPaths, Locks, UnsafeResult, append_line, held_by_another_user, is_slurm_job, \
    lock_keys, open_result, probe_lock, read_result, read_status, restore_keys
from .host.primitives import GPU_QUERY, HERE, KILL_CONFIRM_S, POLL_S, RUN_SUPERVISOR, Fail, Systemd, identity, \
    is_alive, nvidia_smi, parse_gpu_csv, query_apps, start_unit
from .supervision.job import supervise
from .supervision.record import Flags, Job
from .supervision.start import answer_start, claim_job_dir, daemonize_exec, launch_detached, ready_lock, send_ready
from .supervision.settle import Told, restore_unit, settle_as_restorer, start_guard, take_over_hung_restorer, \
    with_restore_lock
from .supervision.spec import check_health_url, check_job_id, check_root, check_root_safe, check_unit, read_spec_stdin
from .host import engine as supervisor_engine, unit_stop
from .supervision import ledger, unit as supervisor_unit
from .supervision.submit import submit
from .supervision.startable import check_payload_user, check_startable
from .supervision import retention, trust

from .progress import SCAN_BYTES, summarize


def slurm_launch():
    """remote_payload/slurm/launch.py, imported on first use: only Slurm jobs need it, and its imports
    (dataclasses, typing) were a third of every call's start-up on the host."""
    from .slurm import launch as module
    return module


GUARD_POLL_S = 2.0           # how often the guard compares a live supervisor with its hard deadline
START_GRACE_S = 60.0         # a status with no supervisor recorded yet is "starting" this long
LOG_MAX_BYTES = 4 << 20


# ── commands ──────────────────────────────────────────────────────────────────────────────────────────

def job_paths(args) -> JobPaths:
    paths = JobPaths(args.root, check_job_id(args.job_id))
    if not os.path.isdir(paths.dir):
        raise Fail("unknown-job", "no job %s on this host" % args.job_id, job_id=args.job_id)
    return paths


def cmd_start(args) -> dict:
    return start_job(args, read_spec_stdin(args.root, check_job_id(args.job_id)))


def start_job(args, spec: dict) -> dict:
    """Claim the job id, then hand the job to Slurm or to its own detached supervisor (supervision/start.py)."""
    paths = JobPaths(args.root, check_job_id(args.job_id))
    claim_job_dir(paths, spec, args.queue)
    if spec.get("launcher") == "slurm":  # Slurm queues it: no lock, no --queue, no detached supervisor here
        return slurm_launch().submit(paths, spec)
    return launch_detached(paths, spec, args.queue, main)


def install_signal_handlers(flags: Flags) -> None:
    def stop(signum, frame):
        flags.signal = signum

    def cancel(signum, frame):
        flags.cancel = True

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    signal.signal(signal.SIGUSR1, cancel)


def cmd_run(args) -> dict:
    """The detached supervisor: claim locks, start the guard, answer `start`, then run the job."""
    if args.ready_fifo:  # started by systemd-run (supervision/unit.py): no fd is passed, the fifo is named
        args.ready_fd = supervisor_unit.open_ready(args.ready_fifo)
        supervisor_unit.start_watchdog()
    os.set_inheritable(args.ready_fd, False)  # the guard and the payload must not hold `start`'s pipe
    paths = JobPaths(args.root, args.job_id)
    job = Job.load(paths)
    flags = Flags()
    install_signal_handlers(flags)
    job.save(supervisor=identity(os.getpid()), launch=supervisor_unit.launch_record(args.job_id))
    locks = Locks(args.root, lock_keys(job.spec), args.job_id)
    locks.open()
    holder = locks.try_acquire()
    if holder is not None and not args.queue:
        with ready_lock(paths):
            shutil.rmtree(paths.dir, ignore_errors=True)  # refused: the id was never used
            send_ready(args.ready_fd, Fail("busy", "%s is held by job %s (supervisor pid %s)" % (
                holder.get("key"), holder.get("job_id", "?"), holder.get("pid", "?")), holder=holder).answer())
        return {"ok": False, "error": "busy"}
    if not answer_start(paths, args.ready_fd, {"ok": True, "job_id": args.job_id, "state": job.status["state"],
                                               "supervisor_pid": os.getpid(), "job_dir": paths.dir,
                                               "queued": holder is not None}):
        locks.release()  # nothing was touched yet: drop the job as if it never was
        shutil.rmtree(paths.dir, ignore_errors=True)
        return {"ok": False, "error": "start-failed"}
    start_guard(job, locks)  # after the answer: before it nothing is stopped, so no guard is needed
    supervise(job, locks, flags)
    return {"ok": True, "state": job.status["state"]}


def cmd_slurm_run(args) -> dict:
    """The batch script's process in a Slurm allocation (remote_payload/slurm/launch.py)."""
    return slurm_launch().run_in_allocation(args.root, check_job_id(args.job_id))


def cmd_guard(args) -> dict:
    """The guard: wait for the supervisor's end (EOF on the life pipe), then settle the job as a restorer
    (nothing to do when the supervisor settled it)."""
    # TERM too: a session scope stopped, logind or oomd TERM every process of the session at once; the guard
    # (in its own session since the fork) must outlive the supervisor to restore after it.
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    paths = JobPaths(args.root, args.job_id)
    message = watch_supervisor(args.life_fd)
    if not os.path.isdir(paths.dir):
        return {"ok": True}
    # re-read under the restore lock: another restorer may have settled it meanwhile; the ledger over status.json
    job = trust.load_for_restore(paths)
    with_restore_lock(job, lambda: settle_as_restorer(trust.load_for_restore(paths), message))
    return {"ok": True, "state": trust.load_for_restore(paths).status["state"]}


def watch_supervisor(life_fd: int) -> str:
    """Until the supervisor's end (EOF on the life pipe), or until it is alive but past its hard deadline
    (hung: stopped, stuck in the kernel): then it counts as failed and is SIGKILLed. The deadline and the
    process to kill are what the supervisor told over the pipe (settle.Told), never status.json, which the
    payload can write."""
    told = Told(life_fd)
    while True:
        if select.select([life_fd], [], [], GUARD_POLL_S)[0] and not told.read():
            return "supervisor died (SIGKILL?); guard restored the service"
        deadline = told.deadline()
        if deadline is not None and time.time() > deadline and is_alive(told.supervisor()):
            os.kill(int(told.supervisor()["pid"]), signal.SIGKILL)
            select.select([life_fd], [], [], KILL_CONFIRM_S)  # its fds close as it dies; never wait longer
            return ("supervisor alive but past its hard deadline in %s (hung); the guard killed it and restored "
                    "the service" % told.last.get("state"))


def reap_if_dead(paths: JobPaths) -> dict:
    """status.json; NOT read-only: a job whose supervisor and guard are both gone is marked LOST here and a
    detached restorer (`supervisor.py restore`) is started to settle it."""
    if is_slurm_job(paths):  # its supervisor runs on a compute node: Slurm says if it lives
        return slurm_launch().refresh(paths)
    try:
        status = read_status(paths)
    except Fail:
        restore_if_owed(paths, trust.owed(paths.root, paths.job_id))  # the ledger says whether a stop is owed
        raise
    if status["state"] in TERMINAL:
        return believed(paths, status)
    entries = trust.owed(paths.root, paths.job_id)
    if trust.job_alive(paths.root, paths.job_id, status, entries):
        return status
    if not entries and status.get("supervisor") is None and time.time() - status.get("created_at", 0) < START_GRACE_S:
        return status  # `start` is still bringing the supervisor up (a job the ledger names has stopped a unit)
    job = Job.load(paths)  # re-read: with both gone nobody writes any more, so this is the last word
    if job.terminal:
        return job.status
    job.set_state("LOST", "supervisor and guard are gone", message="the supervisor and its guard died; "
                  "a restore was started", ending=job.status.get("ending"), ended_at=time.time())
    daemonize_exec(RUN_SUPERVISOR + ["restore", "--job-id", paths.job_id, "--root", paths.root], paths.restore_log)
    return job.status


def believed(paths: JobPaths, status: dict) -> dict:
    """A terminal status, unless the host ledger says the job still owes the restore of a service it stopped
    (the payload can overwrite status.json): then it is not believed. While the job's supervisor or guard
    holds its locks, it is reported as running; with both gone it is marked LOST from the ledger and a
    restorer is started."""
    entries = trust.owed(paths.root, paths.job_id)
    why = trust.contradiction(status, entries)
    if why is None:
        return status
    if trust.holds_locks(paths.root, paths.job_id, entries):
        return dict(status, state="RUNNING", phase=why + ": not believed while the job runs", restored=False)
    job = trust.load_for_restore(paths)
    job.set_state("LOST", job.status["phase"], message=job.status["message"], ended_at=job.status["ended_at"])
    restore_if_owed(paths, entries)
    return job.status


def restore_if_owed(paths: JobPaths, entries: list) -> None:
    """Start a detached `restore` when the ledger names a stop of this job and nobody of the job is alive."""
    if entries and not trust.holds_locks(paths.root, paths.job_id, entries):
        daemonize_exec(RUN_SUPERVISOR + ["restore", "--job-id", paths.job_id, "--root", paths.root],
                       paths.restore_log)


def status_entry(paths: JobPaths) -> dict:
    """The job's status; `restored` is the host ledger's word (no stop of the job owed), never status.json's
    alone, which the payload can write."""
    status = reap_if_dead(paths)
    owed = trust.owed(paths.root, paths.job_id)  # one whose restore failed too: the unit is not back
    return dict(status, supervisor_pid=(status.get("supervisor") or {}).get("pid"),
                progress=payload_progress(paths, status), now=time.time(),
                restored=bool(status.get("restored")) and not owed)


def payload_progress(paths: JobPaths, status: dict):
    """For a job not yet ended: its phase, rows done of expected, and how long its output has been silent
    (read from the event lines in the last MiB of output.log; progress.py has the convention)."""
    if status["state"] in TERMINAL:
        return None
    try:
        with open(paths.output, "rb") as fh:
            info = os.fstat(fh.fileno())
            fh.seek(max(0, info.st_size - SCAN_BYTES))
            text = fh.read(SCAN_BYTES)
    except FileNotFoundError:
        return None
    if info.st_size > SCAN_BYTES:
        text = text.split(b"\n", 1)[-1]  # the first line may be cut
    return dict(summarize(text), output_bytes=info.st_size, silent_s=round(max(0.0, time.time() - info.st_mtime), 1))


def cmd_status(args) -> dict:
    jobs_root = os.path.join(args.root, "jobs")
    named = args.job_id + (read_job_ids_stdin() if args.ids_on_stdin else [])
    ids = named or (sorted(os.listdir(jobs_root)) if os.path.isdir(jobs_root) else [])
    jobs = []
    for job_id in ids:
        paths = JobPaths(args.root, check_job_id(job_id))
        jobs.append(status_entry(paths) if os.path.isdir(paths.dir) else {"job_id": job_id, "state": "UNKNOWN"})
    return {"ok": True, "jobs": jobs}


def read_job_ids_stdin() -> list:
    """`status --ids-on-stdin`: a JSON list of job ids (a list of any length never goes through argv)."""
    try:
        ids = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    except ValueError as exc:
        raise Fail("bad-args", "stdin is not a JSON list of job ids: %s" % exc) from exc
    if not isinstance(ids, list) or not all(isinstance(job_id, str) for job_id in ids):
        raise Fail("bad-args", "stdin is not a JSON list of job ids")
    return ids


def read_log_chunk(path: str, offset: int, limit: int) -> tuple:
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(offset)
            return fh.read(min(limit, max(0, size - offset))), size
    except FileNotFoundError:
        return b"", 0


def cmd_logs(args) -> dict:
    paths = job_paths(args)
    if args.offset < 0 or args.max <= 0:
        raise Fail("bad-args", "--offset must be >= 0 and --max > 0")
    if args.stream:
        return stream_log(paths, args)
    deadline = time.monotonic() + max(0.0, args.wait)
    while True:
        status = reap_if_dead(paths)  # read the state first: a terminal state then covers every byte read below
        data, size = log_chunk(paths, args.offset, min(args.max, LOG_MAX_BYTES))
        terminal = status["state"] in TERMINAL
        if data or terminal or time.monotonic() >= deadline:
            return {"ok": True, "offset": args.offset, "next_offset": args.offset + len(data), "size": size,
                    "data_b64": base64.b64encode(data).decode("ascii"), "state": status["state"],
                    "terminal": terminal, "exit_code": status.get("exit_code"),
                    "message": status.get("message") if terminal else None}
        time.sleep(POLL_S)


def log_chunk(paths: JobPaths, offset: int, limit: int) -> tuple:
    """Up to `limit` bytes of the job's log from `offset`, and the log's size; an offset past it is bad-offset.
    A Slurm job array's log is its variants' logs in turn (slurm/array.py)."""
    data, size = (is_slurm_job(paths) and slurm_launch().log_chunk(paths, offset, limit)) or \
        read_log_chunk(paths.output, offset, limit)
    if offset > size:
        raise Fail("bad-offset", "offset %d is past the end of the log (%d bytes)" % (offset, size), size=size)
    return data, size


def widen_pipe(fd: int) -> None:
    """Our stdout a pipe of a megabyte where it is a pipe and Linux allows it: fewer, larger writes to sshd."""
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except OSError:
        pass


def stream_log(paths: JobPaths, args) -> dict:
    """`logs --stream`: the log from --offset as it grows, on this one call, for up to --wait seconds (with
    --follow until the job ended and every byte went, else until caught up). Each chunk is a frame: a JSON
    header line (`data_len`, `next_offset`, the state read before the bytes), then its raw bytes. The answer
    line is the last frame, with no bytes."""
    deadline, offset = time.monotonic() + max(0.0, args.wait), args.offset
    out = sys.stdout.buffer
    widen_pipe(out.fileno())
    while True:
        status = reap_if_dead(paths)  # read the state first: a terminal state then covers every byte read below
        data, size = log_chunk(paths, offset, min(args.max, LOG_MAX_BYTES))
        frame = {"ok": True, "offset": offset, "next_offset": offset + len(data), "size": size,
                 "state": status["state"], "terminal": status["state"] in TERMINAL,
                 "exit_code": status.get("exit_code"), "data_len": len(data), "last": False}
        if data:
            out.write(json.dumps(frame).encode() + b"\n")
            out.write(data)
            out.flush()
            offset += len(data)
        caught_up = offset >= size
        if (caught_up and (frame["terminal"] or not args.follow)) or time.monotonic() >= deadline:
            return dict(frame, offset=offset, next_offset=offset, data_len=0, last=True,
                        message=status.get("message") if frame["terminal"] else None)
        if caught_up:
            time.sleep(POLL_S)


def cmd_cancel(args) -> dict:
    paths = job_paths(args)
    status = reap_if_dead(paths)
    if status["state"] in TERMINAL:
        return {"ok": True, "job_id": paths.job_id, "state": status["state"], "already": True}
    if is_slurm_job(paths):
        return slurm_launch().cancel(paths, status)
    with open(paths.cancel, "w") as fh:
        fh.write("%f\n" % time.time())
    supervisor = status.get("supervisor")
    if is_alive(supervisor):
        os.kill(int(supervisor["pid"]), signal.SIGUSR1)
    append_line(paths.events, {"t": time.time(), "event": "cancel-requested"})
    return {"ok": True, "job_id": paths.job_id, "state": status["state"], "already": False}


def cmd_restore(args) -> dict:
    """`restore` of a job: settle it as a restorer when its supervisor and guard are both gone. Idempotent:
    a settled job is reported as is (`already`); a live supervisor or guard is left to do it (`deferred`)."""
    paths = job_paths(args)
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
    unit_message = supervisor_unit.stop_post_message()
    if job.status.get("phase") == trust.LEDGER_PHASE:  # rebuilt from the ledger: keep why, whoever runs us
        message = "; ".join(m for m in (message, unit_message) if m)
    else:
        message = unit_message or message
    only = getattr(args, "unit", None)
    if only and [e for e in trust.owed(paths.root, paths.job_id) if e["unit"] != only]:
        # U alone, under U's lock; the job's other stops stay owed to its restorers
        return restore_held(paths, job, ["service-" + only], answer,
                            lambda: restore_unit(trust.load_for_restore(paths), only))
    return restore_held(paths, job, restore_keys(job.spec), answer,
                        lambda: settle_as_restorer(trust.load_for_restore(paths), message))


def restore_held(paths: JobPaths, job: Job, keys: list, answer: dict, act) -> dict:
    """`act` (a restore, True when finished) under the locks `keys` and the job's restore lock. A restorer acts
    only while holding them: a job that holds one now runs on this service and settles our stop through the
    host ledger (it adopts it); starting the service here would be under its run. A lock that a process of
    another user holds (payload.user's, outside the job: no job runs under it) is passed over, noted."""
    foreign = [key for key in keys if held_by_another_user(paths.root, key)]
    if foreign:
        job.note_restore("%s held by a process of another user (not a job's): restoring without it"
                         % ", ".join(foreign))
    locks = Locks(paths.root, [key for key in keys if key not in foreign], paths.job_id)
    locks.open()
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
    started = was not in RUNNING_SERVICE_STATES
    if started:
        start_unit(ctl, unit, deadline - time.monotonic())
    healthy, active = supervisor_engine.wait_healthy(ctl, unit, args.health_url, deadline - time.monotonic())
    shown = ctl.show(unit)
    state = "healthy" if healthy else ("starting" if shown["active_state"] in RUNNING_SERVICE_STATES else "failed")
    if released and released.get("deferred"):  # it runs and answers, but its memory is still released
        state = "starting"
    answer = {"ok": True, "unit": unit, "state": state, "active_state": shown["active_state"],
              "sub_state": shown["sub_state"], "log_tail": None, "released": released, "started": started,
              "was": was}
    if state == "failed":
        answer["log_tail"] = ctl.log_tail(unit)
    return answer


def check_result_file(paths: JobPaths) -> None:
    """Refuse a result.json the answer cannot carry or must not: over the cap, or not a regular file of the
    job dir (a FIFO would block the read until the call's deadline; a symlink may point anywhere)."""
    try:
        fd, info = open_result(paths.result, paths.dir)
    except UnsafeResult as exc:
        what = str(exc)
    except OSError:
        return  # no result (yet), or unreadable: cmd_result says which
    else:
        os.close(fd)
        if info.st_size <= MAX_RESULT_BYTES:
            return
        what = "is %.1f MB, over runner's %d MB cap" % (info.st_size / (1 << 20), MAX_RESULT_BYTES >> 20)
    raise Fail("result-too-large", "job %s: its result.json %s; copy the raw file from the host: %s"
               % (paths.job_id, what, paths.result), job_id=paths.job_id, path=paths.result)


def restore_released_by_job(root: str, unit: str):
    """A unit whose engine a job released (the ledger says which): that job's own `restore` resumes it, under
    its locks (deferred while its supervisor or guard lives, or another job holds them). None otherwise."""
    entry = ledger.read_entry(root, unit)
    if not entry or not entry.get("released") or not entry.get("job_id"):
        return None
    try:
        done = cmd_restore(argparse.Namespace(root=root, job_id=entry["job_id"], unit=unit))
    except Fail as exc:
        return {"job_id": entry["job_id"], "deferred": False, "error": str(exc)}
    # another restorer at work (within its bound) has not resumed it yet either
    deferred = bool(done.get("deferred") or done.get("in_progress"))
    return {"job_id": entry["job_id"], "deferred": deferred, "message": done.get("message")}


def cmd_result(args) -> dict:
    paths = job_paths(args)
    if is_slurm_job(paths):  # a job array's combined result.json is written by the login node's refresh
        reap_if_dead(paths)
    check_result_file(paths)
    try:
        if os.path.getsize(paths.result) == 0:  # payload.user's file, made for it, left unwritten
            raise FileNotFoundError(paths.result)
        return {"ok": True, "job_id": paths.job_id, "result": read_result(paths.result, paths.dir)}
    except (OSError, ValueError, RecursionError) as exc:
        unreadable = "" if isinstance(exc, FileNotFoundError) else " (result.json unreadable: %s)" % exc
        status = reap_if_dead(paths)
        state, why = status.get("state"), status.get("message") or ""
        if state in TERMINAL:
            text = "job %s ended %s without a result%s%s" % (paths.job_id, state, ": " + why if why else "", unreadable)
        else:
            text = "job %s is %s: no result yet%s" % (paths.job_id, state, unreadable)
        prepared = os.path.lexists(paths.prepare_result)
        if prepared:  # said, so nobody takes the prepare step's file for the payload's
            text += " (the payload wrote none; the prepare step's own is %s)" % paths.prepare_result
        raise Fail("no-result", text, job_id=paths.job_id, state=state, prepare_result=prepared) from exc


def preflight_gpus(spec: dict) -> dict:
    devices = spec["gpu"]["devices"]
    if not devices:
        return {"gpus": [], "apps": [], "nvidia_smi": shutil.which("nvidia-smi") is not None}
    if shutil.which("nvidia-smi") is None:
        return {"gpus": [], "apps": [], "nvidia_smi": False}
    found = parse_gpu_csv(nvidia_smi(GPU_QUERY))
    wanted = set(devices)
    # host_gpus: every GPU nvidia-smi lists, so a refusal of a device it lacks can say which ones it has.
    return {"gpus": [g for g in found if g["index"] in wanted or g["uuid"] in wanted], "apps": query_apps(),
            "nvidia_smi": True, "host_gpus": [{"index": g["index"], "uuid": g["uuid"]} for g in found]}


def cmd_preflight(args) -> dict:
    return preflight_report(args, read_spec_stdin(args.root, check_job_id(args.job_id) if args.job_id else None))


def preflight_report(args, spec: dict) -> dict:
    if spec.get("launcher") == "slurm":
        return slurm_launch().preflight("%d.%d.%d" % sys.version_info[:3])
    check_startable(spec)  # before anything else: a job whose payload cannot start is refused, nothing touched
    check_payload_user(spec, args.root)
    found = [preflight_service(args.root, s) for s in services_of(spec)]
    several = {"services": found, "services_kept": spec.get("services_kept", [])} if "services" in spec else {}
    locks = [probe_lock(args.root, key) for key in lock_keys(spec)]
    return dict({"ok": True, "service": found[0] if found else None, "locks": locks,
                 "python": "%d.%d.%d" % sys.version_info[:3]}, **several, **preflight_gpus(spec))


def preflight_service(root: str, spec_service: dict) -> dict:
    """One service the job frees, as it is now: its state, the ledger's entry, what its engine offers."""
    unit = spec_service["unit"]
    ctl = Systemd(spec_service["scope"], spec_service["sudo"])
    service = dict(ctl.show(unit), manager="systemd", unit=unit, ledger=ledger.read_entry(root, unit))
    if spec_service.get("free", "stop") != "stop":  # asked before anything is touched
        service["engine"] = supervisor_engine.offers(spec_service)
    elif spec_service.get("stop", "never") != "never":  # admission says it when the job will stop the unit
        hint = unit_stop.slow_stop_hint(unit, unit_stop.stop_settings(ctl, unit))
        if hint:
            service["stop_hint"] = hint
    return service


def cmd_submit(args) -> dict:
    """Preflight, the admission verdict and the start in one call (one round trip): supervisor_submit.submit;
    then the host's retention rule, bounded (supervision/retention.py)."""
    spec = read_spec_stdin(args.root, check_job_id(args.job_id))
    answer = submit(args, spec, preflight_report, start_job)
    retention.at_submit(args.root, spec)
    return answer


def cmd_gc(args) -> dict:
    """`gc`: the retention rule by hand (supervision/retention.py); --dry-run lists without deleting."""
    if not (args.keep_jobs >= 0 and args.keep_days >= 0):
        raise Fail("bad-args", "--keep-jobs and --keep-days must be >= 0")
    return dict(retention.collect(args.root, args.keep_jobs, args.keep_days, dry_run=args.dry_run), ok=True)


# ── main ──────────────────────────────────────────────────────────────────────────────────────────────

class ArgParser(argparse.ArgumentParser):
    """argparse that raises `bad-args` instead of printing usage and exiting 2."""

    def error(self, message):
        raise Fail("bad-args", message)


def build_parser(sub: str) -> ArgParser:
    parser = ArgParser(prog="supervisor.py " + sub, add_help=False)
    parser.add_argument("--root", required=True)
    if sub == "status":
        parser.add_argument("--job-id", action="append", default=[])
        parser.add_argument("--ids-on-stdin", action="store_true")
    elif sub == "preflight":
        parser.add_argument("--job-id")
    elif sub not in ("restore-service", "gc"):
        parser.add_argument("--job-id", required=True)
    options = {
        "start": [("--queue", dict(action="store_true"))],
        "submit": [("--queue", dict(action="store_true"))],
        "_run": [("--queue", dict(action="store_true")), ("--ready-fd", dict(type=int)), ("--ready-fifo", dict())],
        "_guard": [("--life-fd", dict(type=int, required=True))],
        "logs": [("--offset", dict(type=int, required=True)), ("--max", dict(type=int, default=1 << 20)),
                 ("--wait", dict(type=float, default=0.0)), ("--stream", dict(action="store_true")),
                 ("--follow", dict(action="store_true"))],
        "restore-service": [("--unit", dict(required=True)), ("--scope", dict(choices=SERVICE_SCOPES,
                            default=DEFAULTS["service.scope"])), ("--sudo", dict(action="store_true")),
                            ("--health-url", dict(default=None)), ("--max-wait", dict(type=float, default=50.0))],
        "gc": [("--keep-jobs", dict(type=int, default=retention.KEEP_JOBS)),
               ("--keep-days", dict(type=float, default=retention.KEEP_DAYS)), ("--dry-run", dict(action="store_true"))],
    }
    for flag, kwargs in options.get(sub, []):
        parser.add_argument(flag, **kwargs)
    return parser


COMMANDS = {"preflight": cmd_preflight, "start": cmd_start, "submit": cmd_submit, "status": cmd_status,
            "logs": cmd_logs, "cancel": cmd_cancel, "restore": cmd_restore, "restore-service": cmd_restore_service,
            "result": cmd_result, "gc": cmd_gc, "_run": cmd_run, "_guard": cmd_guard, "slurm-run": cmd_slurm_run}


def dispatch(argv: list) -> dict:
    if not argv or argv[0] not in COMMANDS:
        raise Fail("bad-args", "usage: supervisor.py {%s} … --root ROOT" % ",".join(sorted(COMMANDS)))
    args = build_parser(argv[0]).parse_args(argv[1:])
    args.root = os.path.abspath(os.path.expanduser(check_root(args.root)))
    check_root_safe(args.root, HERE)
    return COMMANDS[argv[0]](args)


def main(argv: list) -> int:
    try:
        answer = dispatch(argv)
    except Fail as exc:
        answer = exc.answer()
    except Exception as exc:  # the one place an unexpected error becomes an answer
        import traceback

        answer = {"ok": False, "error": "internal", "message": "%s: %s" % (type(exc).__name__, exc),
                  "traceback": traceback.format_exc()[-2000:]}
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
    return answer.pop("exit_status", 0 if answer.get("ok") else 1)  # slurm-run: the payload's exit code

