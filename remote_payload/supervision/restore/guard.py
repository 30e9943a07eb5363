"""The guard: a process forked by the supervisor (start_guard) that holds the lock fds and the read end of the
supervisor's life pipe. `_guard` (cmd_guard) waits on it; on EOF, or when the supervisor is alive past its hard
deadline (killed then), it settles the job as a restorer. The deadline counts from what the supervisor told over
the pipe (Told), never from status.json, which the payload can write; its bounds are the job's recorded budget."""
from __future__ import annotations

import json
import os
import select
import signal
import sys
import time

from ...contract import TERMINAL
from ...host.bundle import RUN_SUPERVISOR
from ...host.processes import KILL_CONFIRM_S, identity, is_alive
from ..budget import recorded
from ..files import JobPaths
from ..locks import Locks
from ..record import Job
from .owed import load_for_restore
from .restorers import with_restore_lock
from .settle import settle_as_restorer

GUARD_POLL_S = 2.0           # how often the guard compares a live supervisor with its hard deadline


def start_guard(job: Job, locks: Locks) -> None:
    """Fork the guard with the lock fds and the read end of a pipe only the supervisor writes (Job.tell_guard);
    the write end closes however the supervisor exits, and that EOF wakes the guard."""
    life_r, life_w = os.pipe()
    keep = [life_r] + list(locks.fds.values())
    argv = RUN_SUPERVISOR + ["_guard", "--job-id", job.paths.job_id, "--root", job.paths.root,
                             "--life-fd", str(life_r)]
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            for fd in keep:
                os.set_inheritable(fd, True)
            os.execv(sys.executable, argv)
        finally:
            os._exit(127)
    os.close(life_r)
    os.set_blocking(life_w, False)
    job.guard_pipe = life_w
    job.save(guard=identity(pid))
    job.tell_guard()  # the first line, before any of the payload's code runs


def cmd_guard(args) -> dict:
    """The guard, a restorer: wait for the supervisor's end, then settle the job; it holds the supervisor's
    locks (inherited), so it takes none, and lets them go once the job is settled."""
    # TERM too: logind or oomd TERM a whole session at once; the guard must outlive the supervisor.
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    paths = JobPaths(args.root, args.job_id)
    message = watch_supervisor(args.life_fd)
    if not os.path.isdir(paths.dir):
        return {"ok": True}
    job = load_for_restore(paths)  # the ledger over status.json, which the payload can write
    settled = with_restore_lock(job, lambda job: settle_as_restorer(job, message))
    if settled is not None:
        Locks.inherited(paths.root, paths.job_id).release()
    return {"ok": True, "state": (settled or job).status["state"]}


def watch_supervisor(life_fd: int) -> str:
    """Until the supervisor's end (EOF on the life pipe), or until it is alive past its hard deadline (hung):
    then it is SIGKILLed. Both come from what it told over the pipe (Told)."""
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


def hard_deadline(spec: dict, status: dict):
    """When a live supervisor counts as hung: its step's start plus the budget's hung_*_s; None if nothing waits."""
    if status.get("state") in TERMINAL:
        return None
    bounds = recorded(spec, status)
    state, since = status.get("state"), status.get("updated_at") or time.time()
    if state == "RESTORING":
        return since + bounds["hung_restoring_s"]
    # The run counts from the payload process's own start (each variant gets max_runtime); a prepare step
    # sets no started_at: no hard deadline.
    started = status.get("started_at")
    if started:
        return ((status.get("payload") or {}).get("started_at") or started) + bounds["hung_running_s"]
    if state == "DRAINING":
        return since + bounds["hung_draining_s"]
    if state == "STOPPING_SERVICE":
        return since + bounds["hung_stopping_s"]
    return None


class Told:
    """The last whole line the supervisor told its guard (Job.tell_guard): the hard deadline's only source."""

    def __init__(self, fd: int) -> None:
        self.fd, self.pending = fd, b""
        self.last: dict | None = None

    def read(self) -> bool:
        """Take what the pipe holds; False at EOF (the supervisor is gone)."""
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
            return False
        lines = (self.pending + chunk).split(b"\n")
        self.pending = lines.pop()[-(1 << 16):]
        for line in reversed(lines):
            try:
                told = json.loads(line.decode("ascii"))
            except ValueError:
                continue
            if isinstance(told, dict) and isinstance(told.get("budget"), dict):
                self.last = told
                break
        return True

    def deadline(self):
        """hard_deadline over what the supervisor told (None before its first line)."""
        return hard_deadline({}, self.last) if self.last else None

    def supervisor(self):
        return (self.last or {}).get("supervisor")
