"""The job's detached supervisor: launched away from `start` (launch_detached), then `_run`: it claims the
locks, answers `start`, starts the guard and runs the job.

    start ──systemd-run──▶ runner-job-<id>.service: _run (supervision/unit.py), or where systemd is not:
          ──fork/setsid/fork──▶ run_job in this interpreter's own fork (supervision/start.py daemonize_call)
      ◀── one JSON line: through ready.fifo (unit), over a pipe (fork) ──┘
    _run ──fork/setsid/exec supervisor.py _guard──▶ the guard (restore/guard.py): holds the read end of
          the "life" pipe and the lock fds; EOF = the supervisor is gone
"""
from __future__ import annotations

import os
import shutil
import signal

from ..admission import describe_holder
from ..host.answer import Fail, error_answer, write_answer
from ..host.processes import identity
from . import unit as job_unit
from .files import JobPaths
from .job import supervise
from .locks import Locks, lock_keys
from .record import Flags, Job
from .restore.guard import start_guard
from .start import (
    READY_TIMEOUT_S,
    answer_start,
    daemonize_call,
    give_up_start,
    read_ready,
    ready_lock,
    send_ready,
    start_failed,
)


def install_signal_handlers(flags: Flags) -> None:
    def stop(signum, frame):
        flags.signal = signum

    def cancel(signum, frame):
        flags.cancel = True

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    signal.signal(signal.SIGUSR1, cancel)


def cmd_run(args) -> dict:
    """`_run` in a transient unit (supervision/unit.py): systemd-run passes no fd, so the ready fifo is named."""
    ready_fd = args.ready_fd
    if args.ready_fifo:
        ready_fd = job_unit.open_ready(args.ready_fifo)
        job_unit.start_watchdog()
    return run_job(args.root, args.job_id, ready_fd, args.queue)


def run_job(root: str, job_id: str, ready_fd: int, queue: bool) -> dict:
    """The detached supervisor: claim locks, start the guard, answer `start`, then run the job."""
    os.set_inheritable(ready_fd, False)  # the guard and the payload must not hold `start`'s pipe
    paths = JobPaths(root, job_id)
    job = Job.load(paths)
    flags = Flags()
    install_signal_handlers(flags)
    job.save(supervisor=identity(os.getpid()), launch=job_unit.launch_record(job_id))
    locks = Locks(root, lock_keys(job.spec), job_id)
    holder = locks.try_acquire()
    if holder is not None and not queue:
        with ready_lock(paths):
            shutil.rmtree(paths.dir, ignore_errors=True)  # refused: the id was never used
            send_ready(ready_fd, Fail("busy", "%s is held by %s" % (holder.get("key"), describe_holder(holder)),
                                      holder=holder).answer())
        return {"ok": False, "error": "busy"}
    if not answer_start(paths, ready_fd, {"ok": True, "job_id": job_id, "state": job.status["state"],
                                          "supervisor_pid": os.getpid(), "job_dir": paths.dir,
                                          "queued": holder is not None}):
        locks.release()  # nothing was touched yet: drop the job as if it never was
        shutil.rmtree(paths.dir, ignore_errors=True)
        return {"ok": False, "error": "start-failed"}
    start_guard(job, locks)  # after the answer: before it nothing is stopped, so no guard is needed
    supervise(job, locks, flags)
    return {"ok": True, "state": job.status["state"]}


def launch_detached(paths: JobPaths, spec: dict, queue: bool) -> dict:
    """Start the job's supervisor away from this call; its answer (started, queued, busy or start-failed)."""
    ready_r = job_unit.launch(paths, spec, queue)
    if ready_r is None:
        ready_r, ready_w = os.pipe()
        daemonize_call(run_forked, [paths.root, paths.job_id, ready_w, queue], paths.supervisor_log, keep=[ready_w])
        os.close(ready_w)
    answer = read_ready(ready_r, READY_TIMEOUT_S)
    if answer is None:
        answer = give_up_start(paths, ready_r)
    os.close(ready_r)
    if answer is None:
        return start_failed(paths)
    return answer


def run_forked(job: list) -> int:
    """run_job in the fork launch_detached made; its answer line goes to supervisor.log, as `_run`'s would."""
    root, job_id, ready_fd, queue = job
    try:
        answer = run_job(root, job_id, ready_fd, queue)
    except Exception as exc:
        answer = error_answer(exc)
    return write_answer(answer)
