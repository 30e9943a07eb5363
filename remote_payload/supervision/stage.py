"""A staged payload (payload.staged): started before the service is touched, it does its GPU-free setup
(imports, backend load) while the service still serves, then gets the GPU from the supervisor.

    stage_payload: start it (RUNNER_STAGED=1) → wait for its staged line (limits.stage_timeout, cancel,
                   signals); on any other way out the job ends there, the service never touched
    hand_over:     once the GPU is free, `go\\n` on its stdin; max_runtime counts from here

The payload's side: when RUNNER_STAGED=1, do the setup, print {"event": "staged"} as one JSON line on stdout
(flushed), then read one line from stdin: `go` means the GPU is yours; EOF or anything else means exit at once
without touching the GPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import time

from ..host.processes import KILL_CONFIRM_S, POLL_S, kill_group
from .files import open_regular
from .payload import check_interrupt, interrupt_of, launch_payload, record_exit
from .record import Interrupted

GO = b"go\n"
MAX_LINE = 64 << 10  # a longer line without a newline is not the staged line: dropped, not buffered


def stage_payload(job, flags) -> subprocess.Popen:
    """The payload, started and staged; raises Interrupted (FAILED, TIMED_OUT, CANCELLED) when it is not."""
    check_interrupt(job, flags)
    log = LogLines(job.paths.output)
    began = time.monotonic()
    job.event("stage", status="start")
    proc = launch_payload(job, state="PREPARING", staged=True,
                          phase="staging: the payload's GPU-free setup (the service is untouched)")
    stop = wait_staged(job, proc, flags, log)
    seconds = round(time.monotonic() - began, 3)
    if stop is None:
        job.event("stage", status="staged", seconds=seconds)
        job.save(stage={"seconds": seconds, "staged_at": time.time()})
        return proc
    job.event("stage", status="failed", seconds=seconds, message=stop[1])
    kill_group(proc.pid, job.spec["limits"]["grace"], proc)
    try:
        record_exit(job, proc.wait(timeout=KILL_CONFIRM_S))
    except subprocess.TimeoutExpired:  # SIGKILLed and still there: abandoned, as run_payload does
        job.event("payload-exit", abandoned=True, pid=proc.pid)
    raise Interrupted(stop[0], stop[1] + "; the service was not touched")


def wait_staged(job, proc: subprocess.Popen, flags, log: LogLines):
    """None once the staged line is in the log and the payload still waits (one that exits, even right after
    it, never gets the service stopped); else (state, message)."""
    bound = job.spec["limits"]["stage_timeout"]
    deadline = time.monotonic() + bound
    while True:
        staged = any(is_staged(line) for line in log.new_lines())
        code = proc.poll()
        if code is not None:
            how = "code %d" % code if code >= 0 else "signal %d" % -code
            return "FAILED", "the payload exited with %s while staged (before it was handed the GPU)" % how
        if staged:
            return None
        stop = interrupt_of(job, flags)
        if stop:
            return stop
        if time.monotonic() >= deadline:
            return "TIMED_OUT", "the payload did not print its staged line within limits.stage_timeout (%gs)" % bound
        time.sleep(POLL_S)


def is_staged(line: bytes) -> bool:
    try:
        fields = json.loads(line.decode("utf-8", "replace"))
    except ValueError:
        return False
    return isinstance(fields, dict) and fields.get("event") == "staged"


class LogLines:
    """The complete lines appended to the job's output log since this was made."""

    def __init__(self, path: str) -> None:
        self.path, self.partial = path, b""
        self.offset = os.path.getsize(path) if os.path.exists(path) else 0

    def new_lines(self) -> list:
        try:
            with open_regular(self.path) as fh:  # the payload's log: never a blocking open
                fh.seek(self.offset)
                chunk = fh.read()
        except OSError:
            return []
        self.offset += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop() if len(lines[-1]) <= MAX_LINE else b""
        return lines


def hand_over(job, proc: subprocess.Popen) -> subprocess.Popen:
    """The GPU is free: `go` to the staged payload; its run starts now (state RUNNING, payload.started_at)."""
    assert proc.stdin is not None  # staged with stdin=PIPE (payload.py): `go` is written to it
    try:
        proc.stdin.write(GO)
        proc.stdin.close()
    except OSError:  # it died since it was staged: its exit is recorded as any payload's
        pass
    now = time.time()
    job.event("stage", status="go")
    job.set_state("RUNNING", "payload running", payload=dict(job.status["payload"], started_at=now),
                  **({"started_at": now} if not job.status.get("started_at") else {}))
    return proc
