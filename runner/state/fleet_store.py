"""A fleet run's local record, beside the job records the controller keeps (store.py): which host got which
job, where each host is in the rollout, and why a host was skipped.

    <state dir>/runs/<run id>.json        the run (replaced atomically)
    <state dir>/runs/<run id>.lock        flock: held by the one process driving the rollout
    <state dir>/runs/<run id>.cancel      `runner cancel RUN` was called: start no more hosts
    <state dir>/runs/<run id>.tail.json   per host: did the last `runner tail RUN` end inside a line?

The hosts' job directories stay the source of truth for each job; the run record is only the rollout's
own state (a host's phase), which exists nowhere else.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import RunnerError, UnknownJob
from .store import Store, _write_atomic, private_dir, private_file

# Host calls in flight at once (rollout.forks, like Ansible's forks), each an `ssh` client (three pipes) and on a
# host's first contact a new master: 16 keeps a laptop busy without piling up handshakes or open files.
DEFAULT_FORKS = 16

# A host's phase in the rollout. Terminal: done (its job ended), skipped (never started: refused,
# unreachable, busy), held (not started: stop_on_failure, cancel, or no capacity left).
PENDING, STARTING, STARTED, DONE, SKIPPED, HELD = "pending", "starting", "started", "done", "skipped", "held"
FINAL_PHASES = (DONE, SKIPPED, HELD)


@dataclass
class HostEntry:
    address: str
    job_id: str
    phase: str = PENDING
    stops: bool | None = None  # the preflight's decision: will this host's job stop its service?
    state: str | None = None   # the job's state as last seen
    note: str = ""
    exit: int | None = None    # why a host was skipped: the error's exit code (3 unreachable, 4 refused, 5 busy)
    service_down: bool = False  # its job ended and the service it stopped did not come back

    @property
    def final(self) -> bool:
        return self.phase in FINAL_PHASES

    @property
    def holds_slot(self) -> bool:
        """Counts against max_unavailable: its service is (or may be) stopped by our job."""
        return (bool(self.stops) and self.phase in (STARTING, STARTED)) or self.service_down


@dataclass
class RunRecord:
    run_id: str
    name: str
    spec_path: str
    spec_sha256: str
    overrides: list[str]
    max_unavailable: int
    stop_on_failure: bool
    created_at: float = field(default_factory=time.time)
    queue: bool = False
    hosts: list[HostEntry] = field(default_factory=list)
    forks: int = DEFAULT_FORKS  # host calls at once (rollout.forks or --forks)

    @property
    def finished(self) -> bool:
        return all(entry.final for entry in self.hosts)

    @property
    def state(self) -> str:
        """RUNNING until every host is final; then SUCCEEDED only if every host's job SUCCEEDED."""
        if not self.finished:
            return "RUNNING"
        ok = all(e.phase == DONE and e.state == "SUCCEEDED" and not e.service_down for e in self.hosts)
        return "SUCCEEDED" if ok else "FAILED"

    def entry(self, address: str) -> HostEntry:
        return next(e for e in self.hosts if e.address == address)


class RunStore:
    def __init__(self, store: Store) -> None:
        self.dir = store.runs_dir

    def path(self, run_id: str, suffix: str = ".json") -> Path:
        return self.dir / f"{run_id}{suffix}"

    def exists(self, run_id: str) -> bool:
        return self.path(run_id).is_file()

    def save(self, run: RunRecord) -> None:
        self.write(run.run_id, self.dump(run))

    @staticmethod
    def dump(run: RunRecord) -> str:
        return json.dumps(asdict(run), indent=1)

    def write(self, run_id: str, text: str) -> None:
        """The record as `dump` made it, replaced atomically."""
        private_dir(self.dir)
        _write_atomic(self.path(run_id), text)

    def load(self, run_id: str) -> RunRecord:
        path = self.path(run_id)
        try:
            document = json.loads(path.read_text())
            hosts = [HostEntry(**h) for h in document.pop("hosts")]
            return RunRecord(**document, hosts=hosts)
        except FileNotFoundError:
            raise UnknownJob(f"unknown run id {run_id!r} (not in {self.dir})",
                             hint="`runner list` shows the jobs of every run.") from None
        except (ValueError, TypeError, KeyError) as exc:
            raise RunnerError(f"local run record {path} is unreadable: {exc}") from exc

    @contextmanager
    def driving(self, run_id: str) -> Iterator[bool]:
        """Yield True while this process alone drives the run (a second driver could start one host too many)."""
        private_dir(self.dir)
        fd = os.open(self.path(run_id, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def cancel_requested(self, run_id: str) -> bool:
        return self.path(run_id, ".cancel").exists()

    def request_cancel(self, run_id: str) -> None:
        private_dir(self.dir)
        private_file(self.path(run_id, ".cancel"))

    def open_lines(self, run_id: str) -> dict[str, bool]:
        try:
            return json.loads(self.path(run_id, ".tail.json").read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def save_open_lines(self, run_id: str, open_lines: dict[str, bool]) -> None:
        private_dir(self.dir)
        _write_atomic(self.path(run_id, ".tail.json"), json.dumps(open_lines))

