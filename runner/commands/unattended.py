"""What the CI- and agent-facing commands do (results by id or file, the gate, history recording, wait).

Plain functions returning plain data, like controller.py; cli.py prints and exits.
"""
from __future__ import annotations

import codecs
import io
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from remote_payload.contract import STATES, is_terminal
from remote_payload.progress import parse_event

from ..deadline import Deadline
from ..errors import LogShrank, NoResult, RemoteError, ResultNotYet, RunnerError, SpecError, TransportError, UnknownJob
from ..local_files import read_regular
from ..remote.job_answers import Result
from ..results import clocks, gate, history
from ..results.window import window_of
from ..state.job_id import check_job_id
from ..state.store import JobRecord, Store
from . import controller

WAIT_CHUNK_S = 50.0


@dataclass
class Collected:
    """A result.json and where it came from; `warning` when it could not be recorded in the history. `result` is
    whatever JSON the payload wrote (an object, or not): every reader of it checks its shape."""

    result: Any
    source: str
    job_id: str | None = None
    warning: str | None = None
    window: dict | None = None  # the job's service window (results/window.py), when it freed a service
    partial: str | None = None  # the job ended without a result: why, and that `result` is its log's rows
    declared: dict | None = None  # the job spec's `metrics` (gate.declared_table), when it declares them


def collect(ref: str, *, store: Store, deadline: Deadline, record: bool = True, partial: bool = False) -> Collected:
    """`ref` is a result.json path (`is_result_path`) or a job id; a job's result is fetched and recorded in
    the history (partial: collect_job's)."""
    if is_result_path(ref, store):
        return Collected(read_result(Path(ref)), ref)
    try:
        store.load(check_job_id(ref))
    except (UnknownJob, SpecError):
        raise UnknownJob(f"unknown job id {ref!r}: neither a file nor a job id this controller knows",
                        hint="give a result.json path (with a `/` for one in this directory: ./FILE.json), or a "
                             "job id from `runner list`") from None
    return collect_job(ref, store=store, record=record, deadline=deadline, partial=partial)


def collect_job(job_id: str, *, store: Store, deadline: Deadline, record: bool = True,
                partial: bool = False) -> Collected:
    """A known job's result by its id (never a path) and its service window (results/window.py), both from the
    one `result` call, recorded in the history. partial: a job that ended without a result gives the rows its
    log holds instead (never recorded); NoResult when it holds none."""
    declared = store.load(check_job_id(job_id)).metrics or None  # an unknown id is an unknown job
    try:
        fetched = fetch_result(job_id, store, deadline)
    except NoResult as exc:
        rows = logged_rows(job_id, store, deadline) if partial and not isinstance(exc, ResultNotYet) else []
        if not rows:
            raise
        why = f"{exc}; shown: the {len(rows)} rows its log holds (not recorded in the history)"
        return Collected({"partial": True, "rows": rows}, job_id, job_id, partial=why)
    window = window_of(list(fetched.windows))
    warning = history.record_job(store, job_id, fetched.value, window) if record else None
    return Collected(fetched.value, job_id, job_id, warning, window, declared=declared)


def logged_rows(job_id: str, store: Store, deadline: Deadline) -> list[dict]:
    """The `row` events of the job's log, as many as the deadline lets the log be read from its first byte
    (the tail cursor stays where it is). A payload writes result.json at its end, so a job that failed or
    ran out of time has none, while the rows it printed are in its log whatever became of it."""
    log = io.BytesIO()
    controller.tail(job_id, store=store, out=log, follow=False, max_wait=deadline.left(), from_start=True,
                    save_cursor=False)
    events = filter(None, map(parse_event, log.getvalue().splitlines()))
    return [{k: v for k, v in e.items() if k not in ("event", "t")} for e in events if e["event"] == "row"]


def is_result_path(ref: str, store: Store) -> bool:
    """A path when it has a `/`, or names an existing file that is no job id of the local index; otherwise a
    job id (`--job-id run-7.json` makes one that looks like a file name: `./run-7.json` is the file)."""
    if "/" in ref or os.sep in ref:
        return True
    if not os.path.lexists(ref):
        return False
    try:
        store.load(check_job_id(ref))
    except RunnerError:
        return True
    return False


def fetch_result(job_id: str, store: Store, deadline: Deadline) -> Result:
    """The job's result (and its windows) from its host; a job still running is 75 (call again), one that ended
    without a result is NoResult."""
    try:
        return controller.result(job_id, store=store, deadline=deadline)
    except RemoteError as exc:
        if exc.code not in ("no-result", "result-too-large"):
            raise
        state, message = exc.answer.get("state"), exc.answer.get("message") or str(exc)
        if exc.code == "no-result" and state in STATES and not is_terminal(state):
            raise ResultNotYet(f"{job_id} is still {state}: no result yet; call again once it has ended",
                               hint=f"`runner tail {job_id}` shows its progress; `runner wait {job_id}` blocks "
                                    "until it ends") from None
        raise NoResult(message) from None


def read_result(path: Path) -> Any:
    """A local result.json: any JSON value, from a regular file of at most MAX_RESULT_BYTES."""
    try:
        data = read_regular(path, "a result.json")
    except FileNotFoundError as exc:  # names nothing, like an unknown job id: usage (2), not "no result" (1)
        raise UnknownJob(f"{path}: no such result file: {exc.strerror}",
                         hint="a job id has no `/`; `runner list` shows the known ones") from None
    except OSError as exc:
        raise NoResult(f"{path}: cannot read the result: {exc.strerror or exc}") from exc
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise NoResult(f"{path}: not JSON: {str(exc).splitlines()[0][:200]}") from None


def gate_against(baseline_path: str, current: Collected, tolerance: float) -> list[gate.Verdict]:
    """Read the baseline first: a bad baseline is exit 2 whatever the result holds."""
    baseline = gate.read_baseline(baseline_path)
    return gate.compare(baseline, gate.extract_metrics(current.result, current.declared), tolerance)


def gate_clock_lines(baseline_path: str, current: Collected) -> list[str]:
    """The clocks the baseline and this run were measured at, and a note when they differ."""
    return clocks.clock_lines(gate.read_baseline_document(baseline_path), current.result)


def compare_runs(a: Collected, b: Collected, tolerance: float) -> list[gate.Verdict]:
    """Each metric of either run; SpecError when neither has one (an empty table would read as "same")."""
    verdicts = gate.compare(gate.extract_metrics(a.result, a.declared), gate.extract_metrics(b.result, b.declared),
                            tolerance)
    if not verdicts:
        raise SpecError(f"nothing to compare: neither {a.source} nor {b.source} has metrics the gate knows",
                        hint=gate.DECLARE_HINT)
    return verdicts


# -- wait -------------------------------------------------------------------------------------------------

@dataclass
class WaitOutcome:
    job_id: str
    state: str
    exit_code: int | None
    terminal: bool
    printed: int
    calls: int
    notes: list[str] = field(default_factory=list)


def wait(job_id: str, *, store: Store, out: BinaryIO, timeout: float, chunk: float = WAIT_CHUNK_S,
         progress: Callable[[str], None] = lambda _m: None,
         tail: Callable[..., controller.TailOutcome] = controller.tail,
         clock: Callable[[], float] = time.monotonic) -> WaitOutcome:
    """Follow the log in bounded `tail` calls until the job is terminal or `timeout` passes.

    A lost link after the first successful call is retried until the timeout (the cursor makes this safe:
    no byte twice); a refused host key or a first call that fails is raised at once. Each call moves the
    cursor as `runner tail` does, when it ends: a killed `wait` repeats at most its last chunk. A log found
    shorter than the cursor is followed again from byte 0 (said on progress).
    """
    deadline = clock() + timeout
    printed = calls = 0
    state, code = "UNKNOWN", None
    while True:
        left = deadline - clock()
        if left <= 0:
            return WaitOutcome(job_id, state, code, False, printed, calls)
        try:
            outcome = tail(job_id, store=store, out=out, follow=True, max_wait=min(chunk, left), from_start=False)
        except LogShrank as exc:
            progress(f"[runner] {exc}; following it again from byte 0")  # the cursor is reset: no gap
            continue
        except TransportError as exc:
            if calls == 0 or not exc.retry:
                raise
            progress(f"[runner] {job_id}: {exc}; retrying")
            time.sleep(min(2.0, max(0.0, deadline - clock())))
            continue
        calls += 1
        printed += outcome.printed
        state, code = outcome.state, outcome.exit_code
        if outcome.terminal:
            return WaitOutcome(job_id, state, code, True, printed, calls)


# -- a bounded tail for agents (the MCP server) ---------------------------------------------------------------

@dataclass
class TailText:
    job_id: str
    text: str
    state: str
    exit_code: int | None
    call_again: bool  # false once the job is terminal and every byte has been returned
    offset: int


def tail_text(job_id: str, *, store: Store, max_wait: float, max_bytes: int, follow: bool = False) -> TailText:
    """At most `max_bytes` of new log after the stored cursor, waiting up to `max_wait` for the first byte;
    with follow, for as long as the job runs, until max_bytes are read or max_wait passes (`tail -f`).

    The cursor is `runner tail`'s, taken in turn with it, and moves only past bytes returned: an incomplete
    UTF-8 sequence at the end is held back (while it is all there is, the host is long-polled for the rest), so
    successive texts join to the log exactly (undecodable bytes as \\xNN escapes); completing a character may
    take up to 3 bytes past max_bytes.
    """
    deadline = time.monotonic() + max_wait
    job_id = check_job_id(job_id)
    with store.cursor_turn(job_id, max_wait) as (record, turn):
        if not turn:
            return TailText(job_id, "", record.last_state, None, True, record.cursor)
        text, state, code, done, cursor = _text_after(record, store, max_bytes, deadline, follow)
        store.advance_cursor(job_id, cursor, state)
        return TailText(job_id, text, state, code, not done, cursor)


def _text_after(record: JobRecord, store: Store, max_bytes: int, deadline: float,
                follow: bool) -> tuple[str, str, int | None, bool, int]:
    """(text, state, exit code, every byte returned and the job ended, the new cursor)."""
    data = b""  # read so far; the next poll asks for the bytes after it (a trailing partial character too)
    with controller.connect(record.host, deadline=Deadline.for_command(deadline - time.monotonic())) as client:
        while True:
            left = deadline - time.monotonic()
            wait = max(0.0, min(controller.LONG_POLL_S, left - 0.2))
            try:
                chunk = client.logs(record.job_id, record.cursor + len(data),
                                    max_bytes=max(1, max_bytes - len(data)), wait=wait)
            except RemoteError as exc:
                if exc.code != "bad-offset":
                    raise
                raise controller.log_shrank(record, exc.answer.get("size"), store) from None
            data += chunk.data
            text, used = _decode_prefix(data, final=chunk.terminal and chunk.at_end)
            done = chunk.terminal and record.cursor + used >= chunk.size
            if (text and (not follow or len(data) >= max_bytes)) or done or time.monotonic() >= deadline - 0.25:
                return text, chunk.state, chunk.exit_code, done, record.cursor + used


def _decode_prefix(data: bytes, *, final: bool) -> tuple[str, int]:
    """(text, bytes used): everything but a trailing incomplete UTF-8 sequence, unless this is the end."""
    decoder = codecs.getincrementaldecoder("utf-8")("backslashreplace")
    text = decoder.decode(data, final=final)
    return text, len(data) - len(decoder.getstate()[0])
