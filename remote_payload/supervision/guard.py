"""`_guard`: the guard's loop. It holds the read end of the supervisor's life pipe; on EOF, or when the
supervisor is alive past its hard deadline (killed then), it settles the job as a restorer."""
from __future__ import annotations

import os
import select
import signal
import time

from ..host.processes import KILL_CONFIRM_S, is_alive
from . import trust
from .files import JobPaths
from .locks import Locks
from .settle import Told, settle_as_restorer, with_restore_lock

GUARD_POLL_S = 2.0           # how often the guard compares a live supervisor with its hard deadline


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
    done = with_restore_lock(job, lambda: settle_as_restorer(trust.load_for_restore(paths), message))
    if done:  # restored: the supervisor's locks it holds go as the supervisor's would have
        Locks.inherited(paths.root, paths.job_id).release()
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
                    "the service" % (told.last or {}).get("state"))
