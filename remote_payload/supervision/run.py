"""`_run`: the job's detached supervisor. Claims the locks, answers `start`, starts the guard, runs the job."""
from __future__ import annotations

import os
import shutil
import signal

from . import unit as supervisor_unit
from ..host.primitives import Fail, identity
from .files import JobPaths, Locks, lock_keys
from .job import supervise
from .record import Flags, Job
from .settle import start_guard
from .start import answer_start, ready_lock, send_ready


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
