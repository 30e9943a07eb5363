"""One job's record on the host: status.json and events.jsonl (`Job`), the flags the signal handlers set, and
`Interrupted`, which carries a final state out of a step.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time

from ..contract import DEFAULTS, TERMINAL
from ..host.systemd import Systemd
from .budget import budget
from .files import JobPaths, append_line, append_text, read_json, read_status, release_reserve, stamp, write_json_atomic

SCHEMA = 1


class Interrupted(Exception):
    """A cancel or a signal stopped the job before its payload finished; carries the final state."""

    def __init__(self, state: str, message: str) -> None:
        super().__init__(message)
        self.state = state


class Flags:
    """What the signal handlers set; the loops look at it between steps."""

    def __init__(self) -> None:
        self.cancel = False
        self.signal = None
        self.slurm_term = False  # the cancel is Slurm's TERM (scancel, preemption, its time limit), not ours


class Job:
    """One job's status.json and events.jsonl; every state change goes through `set_state`."""

    def __init__(self, paths: JobPaths, spec: dict, status: dict) -> None:
        self.paths, self.spec, self.status = paths, spec, status
        self.ctl = Systemd(spec["service"].get("scope", DEFAULTS["service.scope"]),
                           spec["service"].get("sudo", DEFAULTS["service.sudo"]))
        self.payload_pids: set[int] = set()  # each payload process launched (each leads its own group)
        self.guard_pipe: int | None = None  # the supervisor's end of its guard's pipe (guard.start_guard)

    @classmethod
    def load(cls, paths: JobPaths) -> Job:
        return cls(paths, read_json(paths.spec), read_status(paths))

    def save(self, durable: bool = True, **changes) -> None:
        """status.json with `changes`; durable=False: whole for every reader, not fsynced (write_json_atomic)."""
        self.status.update(changes)
        self.status["updated_at"] = time.time()
        self.persist(lambda: write_json_atomic(self.paths.status, self.status, durable=durable))

    def set_state(self, state: str, phase: str, **changes) -> None:
        self.enter(state, phase, changes)

    def enter(self, state: str, phase: str, changes: dict, durable: bool = True) -> None:
        self.save(durable, **dict(changes, state=state, phase=phase))
        self.tell_guard()
        self.event("state", state=state, phase=phase)

    def tell_guard(self) -> None:
        """What the guard's hard deadline counts from (never status.json, which the payload can write): one
        JSON line, whole in itself, short enough to be written atomically; never blocks (the guard may hang)."""
        if self.guard_pipe is None:
            return
        status = self.status
        told = {"supervisor": status.get("supervisor"), "budget": status.get("budget"), "state": status.get("state"),
                "updated_at": time.time(), "started_at": status.get("started_at"),
                "payload": {"started_at": (status.get("payload") or {}).get("started_at")}}
        try:
            os.write(self.guard_pipe, (json.dumps(told) + "\n").encode("ascii"))
        except OSError:
            pass  # the guard is gone (EPIPE) or not reading (EAGAIN): it has its own end to act on

    def event(self, kind: str, **fields) -> None:
        self.persist(lambda: append_line(self.paths.events, dict(fields, t=time.time(), event=kind)))

    def note_restore(self, text: str) -> None:
        self.persist(lambda: append_text(self.paths.restore_log, text))
        self.event("restore", message=text)

    def persist(self, write) -> None:
        """A write that can never stop the choreography (a full disk must not keep the service down): on ENOSPC
        the job's reserve is given back once and the write retried; one that still fails is logged, skipped."""
        try:
            write()
            return
        except OSError as exc:
            failure = exc
        if failure.errno in (errno.ENOSPC, errno.EDQUOT) and release_reserve(self.paths):
            try:
                write()
                return
            except OSError as exc:
                failure = exc
        sys.stderr.write("runner supervisor: a write failed and was skipped: %s\n" % failure)

    @property
    def terminal(self) -> bool:
        return self.status.get("state") in TERMINAL


def initial_status(spec: dict, queue: bool = False) -> dict:
    """The record of a job just claimed, with its time budget computed once, here."""
    now = time.time()
    service = service_record(spec["service"]) if spec["service"]["manager"] == "systemd" else {"manager": "none"}
    status = {"schema": SCHEMA, "job_id": spec["job_id"], "name": spec["name"], "state": "QUEUED", "phase": "starting",
              "message": "", "created_at": now, "started_at": None, "ended_at": None, "updated_at": now,
              "supervisor": None, "guard": None, "payload": None, "exit_code": None, "service": service,
              "gpu": dict(spec["gpu"], before=None, drained_after_s=None), "restored": False, "ending": None,
              "budget": budget(spec, now, queue), **stamp()}
    if len(spec.get("services", [])) > 1:  # one record per service (services.py); `service` is the first
        status["services"] = [service_record(s) for s in spec["services"]]
    if spec.get("services_kept"):  # the host's services not on the job's GPUs: never touched
        status["services_kept"] = list(spec["services_kept"])
    return status


def service_record(service: dict) -> dict:
    return dict(service, was=None, now=None, stopped=False, stopped_at=None, restored_at=None, downtime_s=None,
                healthy=None)


def signal_name(sig: int) -> str:
    """SIGTERM, …; a real-time signal (no Signals member) SIGRTMIN+n."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return "SIGRTMIN+%d" % (sig - signal.SIGRTMIN) if sig >= signal.SIGRTMIN else "signal %d" % sig
