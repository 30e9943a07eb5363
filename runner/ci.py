"""What the CI- and agent-facing commands do (results by id or file, the gate, history recording, wait).

Plain functions returning plain data, like controller.py; cli.py prints and exits.
"""
from __future__ import annotations

import codecs
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable

from . import controller, gate, history
from .errors import HostKeyError, NoResult, TransportError
from .deadline import Deadline
from .job_id import check_job_id
from .store import Store

WAIT_CHUNK_S = 50.0


@dataclass
class Collected:
    """A result.json and where it came from; `warning` when it could not be recorded in the history."""

    result: dict
    source: str
    job_id: str | None = None
    warning: str | None = None


def collect(ref: str, *, store: Store, record: bool = True, deadline: Deadline | None = None) -> Collected:
    """`ref` is a result.json path or a job id; a job's result is fetched and recorded in the history."""
    path = Path(ref)
    if ref.endswith(".json") or path.is_file():
        return Collected(_read_result(path), str(path))
    result = controller.result(ref, store=store, deadline=deadline)
    warning = history.record_job(store, ref, result) if record else None
    return Collected(result, ref, ref, warning)


def _read_result(path: Path) -> dict:
    try:
        result = json.loads(path.read_text())
    except OSError as exc:
        raise NoResult(f"{path}: cannot read the result: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise NoResult(f"{path}: not JSON: {exc}") from exc
    if not isinstance(result, dict):
        raise NoResult(f"{path}: a result is a JSON object, got {type(result).__name__}")
    return result


def gate_against(baseline_path: str, current: Collected, tolerance: float) -> list[gate.Verdict]:
    """Read the baseline first: a bad baseline is exit 2 whatever the result holds."""
    baseline = gate.read_baseline(baseline_path)
    return gate.compare(baseline, gate.extract_metrics(current.result), tolerance)


def compare_runs(a: Collected, b: Collected, tolerance: float) -> list[gate.Verdict]:
    return gate.compare(gate.extract_metrics(a.result), gate.extract_metrics(b.result), tolerance)


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
         progress: Callable[[str], None] = lambda _m: None, tail=controller.tail,
         clock: Callable[[], float] = time.monotonic) -> WaitOutcome:
    """Follow the log in bounded `tail` calls until the job is terminal or `timeout` passes.

    A lost link after the first successful call is retried until the timeout (the cursor makes this safe:
    no byte twice); a refused host key or a first call that fails is raised at once.
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
        except TransportError as exc:
            if calls == 0 or isinstance(exc, HostKeyError):
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


def tail_text(job_id: str, *, store: Store, max_wait: float, max_bytes: int) -> TailText:
    """At most `max_bytes` of new log after the stored cursor, waiting up to `max_wait` for the first byte.

    The cursor is the same one `runner tail` uses and moves only past bytes returned: an incomplete UTF-8
    sequence at the end of a chunk is held back for the next call, so the texts of successive calls join
    to the log exactly (undecodable bytes appear as \\xNN escapes).
    """
    deadline = time.monotonic() + max_wait
    record = store.load(check_job_id(job_id))
    with controller.connect(record.host, deadline=Deadline(max_wait + controller.ROUND_TRIP_ALLOWANCE_S)) as client:
        while True:
            left = deadline - time.monotonic()
            wait = max(0.0, min(controller.LONG_POLL_S, left - 0.2))
            answer = client.logs(job_id, record.cursor, max_bytes=max_bytes, wait=wait)
            at_end = answer["next_offset"] >= answer["size"]
            text, used = _decode_prefix(answer["data"], final=answer["terminal"] and at_end)
            record.cursor += used
            record.last_state = answer["state"]
            store.save(record)
            done = answer["terminal"] and record.cursor >= answer["size"]
            # Any bytes end the call, even a held-back partial character: polling again would spin on it.
            if answer["data"] or done or time.monotonic() >= deadline - 0.25:
                return TailText(job_id, text, answer["state"], answer.get("exit_code"), not done, record.cursor)


def _decode_prefix(data: bytes, *, final: bool) -> tuple[str, int]:
    """(text, bytes used): everything but a trailing incomplete UTF-8 sequence, unless this is the end."""
    decoder = codecs.getincrementaldecoder("utf-8")("backslashreplace")
    text = decoder.decode(data, final=final)
    return text, len(data) - len(decoder.getstate()[0])
