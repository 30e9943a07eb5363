"""Looking at a fleet run: `runner status RUN`, `runner tail RUN`, `runner results RUN`.

Each asks every host at once (fleet.for_each_host) and reports each host on its own: an unreachable host
is a line saying so, never an error that hides the others. Exit codes are per host, then the worst wins.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from remote_payload.contract import is_terminal

from ..commands import controller, render
from ..deadline import Deadline
from ..errors import EXIT_FAILED, EXIT_STILL_RUNNING, EXIT_UNREACHABLE, RunnerError, exit_code, first_line
from ..remote.job_answers import JobStatus
from ..state.fleet_store import DONE, HELD, PENDING, SKIPPED, STARTED, STARTING, HostEntry, RunRecord, RunStore
from ..state.job_id import check_job_id
from ..state.store import Store
from .fleet import for_each_host


def state_exit(state: str | None) -> int:
    """A host's job state as an exit status; no state yet (not started, not finished) is still running."""
    return exit_code(state) if state and is_terminal(state) else EXIT_STILL_RUNNING


def _has_job(entry: HostEntry, store: Store) -> bool:
    """A job record exists for this host (STARTING: only if its start got that far)."""
    return entry.phase in (STARTED, DONE) or (entry.phase == STARTING and (store.jobs_dir / f"{entry.job_id}.json").is_file())


def _error_exit(exc: RunnerError) -> int:
    """Unreachable stays 3 (it may be fine); any other error about a host's job counts as failed."""
    return EXIT_UNREACHABLE if exc.exit_code == EXIT_UNREACHABLE else EXIT_FAILED


def _phase_exit(entry: HostEntry) -> int:
    return EXIT_FAILED if entry.phase in (SKIPPED, HELD) else EXIT_STILL_RUNNING


# -- status -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HostRow:
    """One host of `runner status RUN`: the run's view of it (phase, note), its job's live status from its host
    or why there is none (`error`), and the exit status of what was found."""

    address: str
    job_id: str
    phase: str
    note: str
    stops_service: bool | None
    exit: int
    job: JobStatus | None = None
    error: str | None = None

    def to_json(self) -> dict:
        """The row as `--json` prints it: the job's status as its host answered it."""
        row: dict[str, object] = {"address": self.address, "job_id": self.job_id, "phase": self.phase,
                                  "note": self.note, "stops_service": self.stops_service}
        if self.error is not None:
            row["error"] = self.error
        if self.job is not None:
            row["job"] = self.job.raw
        row["exit"] = self.exit
        return row


def status(run_id: str, *, store: Store, deadline: Deadline) -> tuple[RunRecord, list[HostRow]]:
    """Per host: the run's view (phase, note) and the job's live status from its host, or the error."""
    run = RunStore(store).load(check_job_id(run_id))
    live = [e for e in run.hosts if _has_job(e, store)]
    answers, errors = for_each_host(live, lambda e: controller.status([e.job_id], store=store, deadline=deadline)[0])
    rows = []
    for entry in run.hosts:
        job, error = answers.get(entry.address), errors.get(entry.address)
        rows.append(HostRow(entry.address, entry.job_id, entry.phase, entry.note, entry.stops,
                            _row_exit(entry, job, error), job, first_line(error) if error is not None else None))
    return run, rows


def _row_exit(entry: HostEntry, job: JobStatus | None, error: RunnerError | None) -> int:
    """Its host's error's exit, else its job's state's; a host not asked: its phase's (a DONE one's last state)."""
    if error is not None:
        return _error_exit(error)
    if job is not None:
        return state_exit(job.state)
    return _phase_exit(entry) if entry.phase != DONE else state_exit(entry.state)


def status_text(run: RunRecord, rows: list[HostRow]) -> str:
    done = sum(1 for r in rows if r.phase in (DONE, SKIPPED, HELD))
    lines = [f"{run.run_id}: fleet of {len(rows)}, max_unavailable {run.max_unavailable}, "
             f"{done} of {len(rows)} hosts final ({run.state})"]
    width = max(len(r.address) for r in rows)
    for row in rows:
        lines.append(f"  {row.address:<{width}}  {_host_line(row)}")
    return "\n".join(lines)


def _host_line(row: HostRow) -> str:
    if row.error:
        return f"{row.job_id}  UNREACHABLE: {row.error}"
    if row.job is None:
        return f"{row.phase.upper()}: {row.note}" if row.note else row.phase.upper()
    return render.job_line(row.job)


# -- tail -----------------------------------------------------------------------------------------------------

class PrefixedSink:
    """One host's log bytes, each line prefixed `[HOST] `. A line still open when the call ends is printed
    (with a newline) and its rest, in the next call, is prefixed `[HOST]+ `: every byte once, lines whole."""

    def __init__(self, address: str, out: BinaryIO, lock: threading.Lock, continuing: bool) -> None:
        self.out, self.lock, self.continuing = out, lock, continuing
        self.prefix, self.rest_prefix = f"[{address}] ".encode(), f"[{address}]+ ".encode()
        self.pending = b""

    def write(self, data: bytes) -> None:
        *lines, self.pending = (self.pending + data).split(b"\n")
        self._emit(lines)

    def flush(self) -> None:
        pass

    def close(self) -> bool:
        """Print a line left open; True when the next call continues it (also when this call printed
        nothing after a line the last call left open)."""
        if not self.pending:
            return self.continuing
        self._emit([self.pending])
        self.pending = b""
        return True

    def _emit(self, lines: list[bytes]) -> None:
        if not lines:
            return
        chunk = []
        for line in lines:
            chunk.append((self.rest_prefix if self.continuing else self.prefix) + line + b"\n")
            self.continuing = False
        with self.lock:
            self.out.write(b"".join(chunk))
            self.out.flush()


def tail(run_id: str, *, store: Store, out: BinaryIO, follow: bool, max_wait: float, from_start: bool,
         progress: Callable[[str], None]) -> tuple[RunRecord, dict[str, int]]:
    """Every started host's log after its own cursor (controller.tail, one thread per host, each bounded by
    max_wait), prefixed by host; per host the exit code of what it found. Each host's cursor moves as
    `runner tail`'s does, when its call ends, after its open line was printed."""
    runs = RunStore(store)
    run = runs.load(check_job_id(run_id))
    open_lines = {} if from_start else runs.open_lines(run_id)
    lock = threading.Lock()
    sinks = {e.address: PrefixedSink(e.address, out, lock, open_lines.get(e.address, False)) for e in run.hosts}

    still_open = dict(open_lines)

    def one(entry: HostEntry) -> int:
        # the open line is printed before this host's cursor moves past it
        def delivered(_outcome: controller.TailOutcome) -> None:
            still_open[entry.address] = sinks[entry.address].close()

        outcome = controller.tail(entry.job_id, store=store,
                                  out=sinks[entry.address],
                                  follow=follow, max_wait=max_wait, from_start=from_start, delivered=delivered)
        return state_exit(outcome.state) if outcome.terminal else EXIT_STILL_RUNNING

    answers, errors = for_each_host([e for e in run.hosts if _has_job(e, store)], one)
    runs.save_open_lines(run_id, still_open)
    codes = {}
    for entry in run.hosts:
        if entry.address in errors:
            progress(f"[runner] {entry.address}: {first_line(errors[entry.address])}")
            codes[entry.address] = _error_exit(errors[entry.address])
        else:
            codes[entry.address] = answers.get(entry.address, _phase_exit(entry))
    if any(e.phase == PENDING for e in run.hosts):
        progress(f"[runner] {run_id}: hosts still pending; the rollout goes on under `runner wait {run_id}`")
    return run, codes


# -- results --------------------------------------------------------------------------------------------------

@dataclass
class HostResults:
    results: dict[str, dict]  # address -> result.json
    missing: dict[str, str]   # address -> why there is none


def results(run_id: str, *, store: Store, deadline: Deadline) -> HostResults:
    run = RunStore(store).load(check_job_id(run_id))
    live = [e for e in run.hosts if _has_job(e, store)]
    found, errors = for_each_host(live, lambda e: controller.result(e.job_id, store=store, deadline=deadline).value)
    missing = {a: first_line(exc) for a, exc in errors.items()}
    for entry in run.hosts:
        if entry.address not in found and entry.address not in missing:
            missing[entry.address] = f"{entry.phase}: {entry.note}" if entry.note else entry.phase
    return HostResults({e.address: found[e.address] for e in run.hosts if e.address in found}, missing)
