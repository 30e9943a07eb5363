"""Every answer a host gives, checked against the wire contract (docs/protocol.md, "Subcommands") before the
controller uses or stores any of it: types, bounds and sizes, per verb.

A host is trusted to run jobs, not to be well-formed: a broken or compromised supervisor, or a payload that
rewrote its job's status.json, must neither crash the controller nor poison its local index (a cursor of "abc",
a state holding terminal escapes). A breach is BadAnswer, exit 3, naming the field and what was expected, never
what the host sent.

Pure, no I/O: host.py calls `parse_line` where it reads an answer line, `failure` for `ok: false`, and one
checker per HostClient method, which returns what that method returns: typed where the layers above read it
field by field (`LogChunk` here; `Started`, `JobStatus` and `Result` in job_answers.py).
"""
from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from remote_payload.contract import STATES, TERMINAL

from ..errors import BadAnswer
from .job_answers import JobStatus, Result, Started

# The longest answer line read: a result.json or a 4 MiB log chunk in base64 fits many times over.
MAX_ANSWER_BYTES = 32 << 20
# The deepest nesting of arrays and objects in an answer: the wire's own stay under 10 levels, and a deeper
# result.json is no benchmark's table (json itself gives up near 1000, with a RecursionError).
MAX_DEPTH = 64

Check = Callable[[Any, str], None]


class _Wrong(Exception):
    def __init__(self, where: str, why: str) -> None:
        super().__init__(where, why)
        self.where, self.why = where, why


def _bad(verb: str, where: str, why: str) -> BadAnswer:
    return BadAnswer(f"the host answered something runner does not understand ({verb}: {where}: {why})",
                     hint="The supervisor on the host is not the one runner uploaded, or a job's status.json was "
                          "overwritten (its payload can write there); nothing of this answer was used or stored.")


def oversized(host: str) -> BadAnswer:
    """stdout that ran past the cap while it was read (the transport stopped reading it there)."""
    return _bad(host, "answer", f"more than the {MAX_ANSWER_BYTES} bytes an answer may have; not read further")


def no_json(verb: str, exit_code: int, stderr_tail: str) -> BadAnswer:
    """An answer with no JSON object on its last line (a login banner, a crash): outside the contract too."""
    error = _bad(verb, "answer", f"no JSON object (exit {exit_code})")
    error.hint = (f"The host's stderr ends: {stderr_tail}\n" if stderr_tail else "") + error.hint
    return error


# -- reading the line -----------------------------------------------------------------------------------

def parse_line(stdout: bytes, verb: str) -> dict | None:
    """The answer object on the last line of stdout; None when there is no JSON object at all (the caller
    says why: no interpreter, a crash). Too long, too deep or an `ok` that is not a boolean is BadAnswer."""
    if len(stdout) > MAX_ANSWER_BYTES:
        raise _bad(verb, "answer", f"{len(stdout)} bytes, more than the {MAX_ANSWER_BYTES} an answer may have")
    lines = stdout.decode("utf-8", "replace").strip().splitlines()
    if not lines:
        return None
    try:
        answer = json.loads(lines[-1])
    except RecursionError:
        raise _bad(verb, "answer", f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError:
        return None
    if not isinstance(answer, dict):
        return None
    if _depth_over(answer, MAX_DEPTH):
        raise _bad(verb, "answer", f"nested deeper than {MAX_DEPTH} levels")
    if not isinstance(answer.get("ok", False), bool):
        raise _bad(verb, "ok", f"expected true or false, got {_kind(answer['ok'])}")
    return answer


def _depth_over(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


# -- the pieces answers are made of ------------------------------------------------------------------------

def _kind(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "text", list: "a list", dict: "an object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _expect(name: str, test: Callable[[Any], bool]) -> Check:
    def check(value: Any, where: str) -> None:
        if not test(value):
            raise _Wrong(where, f"expected {name}, got {_kind(value)}")
    return check


def _one_of(name: str, allowed: Collection[str]) -> Check:
    def check(value: Any, where: str) -> None:
        if not (isinstance(value, str) and value in allowed):
            raise _Wrong(where, f"expected {name}, got {'other text' if isinstance(value, str) else _kind(value)}")
    return check


def _optional(check: Check) -> Check:
    def optional(value: Any, where: str) -> None:
        if value is not None:
            check(value, where)
    return optional


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _record(fields: dict[str, Check], required: Sequence[str] = ()) -> Check:
    """An object whose listed fields (when present; `required` ones always) pass their checks; others pass."""
    def check(value: Any, where: str) -> None:
        OBJECT(value, where)
        for key in required:
            if key not in value:
                raise _Wrong(_at(where, key), "missing")
        for key, field in fields.items():
            if key in value:
                field(value[key], _at(where, key))
    return check


def _list_of(item: Check) -> Check:
    def check(value: Any, where: str) -> None:
        LIST(value, where)
        for index, element in enumerate(value):
            item(element, _at(where, str(index)))
    return check


def _either(*checks: Check) -> Check:
    def check(value: Any, where: str) -> None:
        for one in checks:
            try:
                return one(value, where)
            except _Wrong:
                continue
        checks[-1](value, where)
    return check


TEXT = _expect("text", lambda v: isinstance(v, str))
INT = _expect("an integer", _is_int)
COUNT = _expect("an integer >= 0", lambda v: _is_int(v) and v >= 0)
NUMBER = _expect("a finite number", lambda v: _is_int(v) or (isinstance(v, float) and math.isfinite(v)))
ANY_NUMBER = _expect("a number", lambda v: _is_int(v) or isinstance(v, float))  # a payload's, NaN included
BOOL = _expect("true or false", lambda v: isinstance(v, bool))
OBJECT = _expect("an object", lambda v: isinstance(v, dict))
LIST = _expect("a list", lambda v: isinstance(v, list))
SCALAR = _expect("text, a number, a boolean or null", lambda v: v is None or isinstance(v, (str, int, float, bool)))
STATE = _one_of("a job state", STATES)
STATUS_STATE = _one_of("a job state or UNKNOWN", (*STATES, "UNKNOWN"))
OPT_TEXT, OPT_INT, OPT_COUNT, OPT_NUMBER, OPT_BOOL = map(_optional, (TEXT, INT, COUNT, NUMBER, BOOL))


# -- the answers, per verb (docs/protocol.md) ------------------------------------------------------------

GPU = _record({"index": _either(TEXT, COUNT), "uuid": OPT_TEXT, "name": OPT_TEXT, "total_mib": OPT_NUMBER,
               "used_mib": OPT_NUMBER, "free_mib": OPT_NUMBER}, required=("index",))
HOLDER = _optional(_record({"job_id": OPT_TEXT, "pid": _optional(SCALAR), "key": OPT_TEXT, "user": OPT_TEXT,
                            "root": OPT_TEXT, "command": OPT_TEXT}))
LOCK = _record({"key": TEXT, "held": BOOL, "holder": HOLDER}, required=("key", "held"))
SERVICE_REPORT = _record({"manager": OPT_TEXT, "unit": OPT_TEXT, "active_state": OPT_TEXT, "sub_state": OPT_TEXT,
                          "ledger": _optional(_record({"job_id": OPT_TEXT}))})
REPORT = _record({
    "gpus": _list_of(GPU),
    "apps": _list_of(_record({"pid": SCALAR, "used_mib": SCALAR}, required=("pid", "used_mib"))),
    "service": _optional(SERVICE_REPORT), "services": _optional(_list_of(SERVICE_REPORT)),
    "services_kept": _optional(_list_of(TEXT)),
    "locks": _list_of(LOCK), "python": OPT_TEXT, "nvidia_smi": BOOL,
}, required=("gpus", "locks"))
START = _record({"job_id": TEXT, "state": STATE, "supervisor_pid": OPT_INT, "job_dir": OPT_TEXT, "queued": OPT_BOOL,
                 "slurm_job_id": OPT_TEXT}, required=("job_id", "state"))
SUBMIT = _record({"report": REPORT, "started": BOOL, "stop_service": OPT_BOOL, "notes": _list_of(TEXT)},
                 required=("report", "started"))

# One job's status: its status.json (schema 1) as the host read it, plus what `status` adds.
SERVICE_STATUS = _optional(_record({
    "manager": OPT_TEXT, "unit": OPT_TEXT, "was": OPT_TEXT, "now": OPT_TEXT, "stopped": OPT_BOOL,
    "stopped_at": OPT_NUMBER, "restored_at": OPT_NUMBER, "downtime_s": OPT_NUMBER, "healthy": OPT_BOOL}))
PROGRESS = _optional(_record({
    "phase": SCALAR, "phase_status": SCALAR, "rows_done": COUNT, "rows_expected": OPT_COUNT,
    "last_t": _optional(ANY_NUMBER), "errors": OPT_COUNT, "output_bytes": OPT_COUNT, "silent_s": OPT_NUMBER,
    "variant": _optional(_record({"index": OPT_INT, "of": OPT_INT, "args": _optional(OBJECT), "status": OPT_TEXT})),
}, required=("rows_done",)))
ARRAY = _optional(_record({**{k: COUNT for k in ("of", "done", "succeeded", "failed", "skipped", "running", "pending")},
                           "reasons": _optional(_either(OBJECT, LIST))},
                          required=("of", "done", "succeeded", "failed", "skipped", "running", "pending")))
SLURM = _optional(_record({k: OPT_TEXT for k in ("job_id", "state", "reason", "node", "cuda_visible_devices")}))
STATUS_ENTRY = _record({
    "job_id": TEXT, "state": STATUS_STATE, "name": OPT_TEXT, "phase": OPT_TEXT, "message": OPT_TEXT,
    **{k: OPT_NUMBER for k in ("created_at", "started_at", "ended_at", "updated_at", "now")},
    "exit_code": OPT_INT, "supervisor_pid": OPT_INT, "restored": OPT_BOOL,
    "service": SERVICE_STATUS, "services": _optional(_list_of(SERVICE_STATUS)),
    "services_kept": _optional(_list_of(TEXT)), "progress": PROGRESS, "array": ARRAY, "slurm": SLURM,
}, required=("job_id", "state"))
STATUS = _record({"jobs": _list_of(STATUS_ENTRY)}, required=("jobs",))
LOGS = _record({"offset": COUNT, "next_offset": COUNT, "size": COUNT, "data_b64": TEXT, "state": STATE,
                "terminal": BOOL, "exit_code": OPT_INT},
               required=("offset", "next_offset", "size", "data_b64", "state", "terminal"))
LOG_FRAME = _record({"offset": COUNT, "next_offset": COUNT, "size": COUNT, "data_len": COUNT, "state": STATE,
                     "terminal": BOOL, "exit_code": OPT_INT, "last": BOOL},
                    required=("offset", "next_offset", "size", "data_len", "state", "terminal", "last"))
CANCEL = _record({"job_id": OPT_TEXT, "state": STATE, "already": OPT_BOOL}, required=("state",))
RESTORE_SERVICE = _record({"unit": OPT_TEXT, "state": _one_of("healthy, starting or failed",
                                                              ("healthy", "starting", "failed")),
                           "active_state": OPT_TEXT, "sub_state": OPT_TEXT, "log_tail": OPT_TEXT,
                           "health_note": OPT_TEXT}, required=("state",))
WINDOW = _record({"unit": OPT_TEXT, "window": OBJECT}, required=("window",))
RESULT = _record({"windows": _list_of(WINDOW)}, required=("result",))
GC = _record({"jobs": _list_of(TEXT), "payloads": _list_of(TEXT), "supervisors": _list_of(TEXT),
              "others": _list_of(TEXT), "dry_run": BOOL,
              "kept": COUNT, "complete": BOOL, "keep_jobs": COUNT, "keep_days": NUMBER},
             required=("jobs", "payloads", "supervisors", "dry_run", "kept", "complete"))
FAILURE = _record({"error": TEXT, "message": OPT_TEXT, "hint": OPT_TEXT, "stage": OPT_TEXT, "same_spec": OPT_BOOL,
                   "report": REPORT, "holder": HOLDER})


def _checked(verb: str, answer: Any, shape: Check) -> Any:
    try:
        shape(answer, "")
    except _Wrong as wrong:
        raise _bad(verb, wrong.where or "answer", wrong.why) from None
    return answer


def failure(verb: str, answer: dict) -> dict:
    """An `ok: false` answer: its error code, message and the parts the controller reads (report, holder)."""
    return _checked(verb, answer, FAILURE)


def preflight(answer: dict) -> dict:
    return _checked("preflight", answer, REPORT)


def submit(answer: dict, job_id: str) -> Started:
    """`report` and start's answer: the host either started the job or answered its refusal as an error."""
    if not _checked("submit", answer, SUBMIT)["started"]:
        raise _bad("submit", "started", "expected true (a host that does not start the job answers an error)")
    if _checked("submit", answer, START)["job_id"] != job_id:
        raise _bad("submit", "job_id", "not the job asked for")
    return Started.from_json(answer)


def status(answer: dict, job_ids: Sequence[str]) -> list[JobStatus]:
    """The jobs asked for, one entry each in the order asked (every job when none was named)."""
    jobs = _checked("status", answer, STATUS)["jobs"]
    if job_ids and len(jobs) != len(job_ids):
        raise _bad("status", "jobs", f"{len(job_ids)} asked for, {len(jobs)} answered")
    for index, (job, job_id) in enumerate(zip(jobs, job_ids)):
        if job["job_id"] != job_id:
            raise _bad("status", f"jobs.{index}.job_id", "not the job asked for")
    return [JobStatus.from_json(job) for job in jobs]


def logs(answer: dict, offset: int, max_bytes: int) -> LogChunk:
    """The chunk asked for, its bytes decoded: from `offset`, at most `max_bytes`, with a `next_offset` that is
    `offset` plus its length and within `size`."""
    _checked("logs", answer, LOGS)
    if answer["offset"] != offset:
        raise _bad("logs", "offset", f"{offset} asked for, {answer['offset']} answered")
    encoded = answer["data_b64"]
    if len(encoded) > 4 * (max_bytes // 3 + 1):
        raise _bad("logs", "data_b64", f"more than the {max_bytes} bytes asked for")
    try:
        data = base64.b64decode(encoded, validate=True)
    except ValueError:  # binascii.Error, or text that is not ASCII
        raise _bad("logs", "data_b64", "not base64") from None
    if len(data) > max_bytes:
        raise _bad("logs", "data_b64", f"{len(data)} bytes, more than the {max_bytes} bytes asked for")
    _in_the_log(answer, offset, len(data))
    return LogChunk.from_json(answer, data)


def log_frame(answer: dict, offset: int, max_bytes: int) -> dict:
    """One frame of `logs --stream`: its header, from `offset`, announcing at most `max_bytes` bytes (none in
    the last frame) with a `next_offset` that is `offset` plus them and within `size`; the caller reads the
    bytes that follow it and makes the LogChunk."""
    _checked("logs", answer, LOG_FRAME)
    if answer["offset"] != offset:
        raise _bad("logs", "offset", f"{offset} asked for, {answer['offset']} answered")
    if answer["data_len"] > (0 if answer["last"] else max_bytes):
        raise _bad("logs", "data_len", f"more than the {max_bytes} bytes a frame may hold")
    _in_the_log(answer, offset, answer["data_len"])
    return answer


def _in_the_log(answer: dict, offset: int, sent: int) -> None:
    """A chunk's or a frame's `sent` bytes end at its `next_offset`, within the log's size; `terminal` is its
    state's."""
    if answer["next_offset"] != offset + sent:
        raise _bad("logs", "next_offset", "not offset plus the bytes sent")
    if answer["next_offset"] > answer["size"]:
        raise _bad("logs", "next_offset", "past the log's size")
    if answer["terminal"] != (answer["state"] in TERMINAL):
        raise _bad("logs", "terminal", "disagrees with state")


def cancel(answer: dict) -> dict:
    return _checked("cancel", answer, CANCEL)


def restore_service(answer: dict) -> dict:
    return _checked("restore-service", answer, RESTORE_SERVICE)


def gc(answer: dict) -> dict:
    return _checked("gc", answer, GC)


def result(answer: dict) -> Result:
    """`result`'s answer: the result.json as parsed on the host (any JSON value: the renderers judge its shape)
    and the windows of the services the job freed."""
    return Result.from_json(_checked("result", answer, RESULT))


# -- the typed answer of `logs` (those of status, submit and result: job_answers.py) ------------------------

@dataclass(frozen=True)
class LogChunk:
    """A piece of a job's log (`logs`): `data` from `offset` to `next_offset`, of a log `size` bytes long now."""

    offset: int
    next_offset: int
    size: int
    data: bytes
    state: str
    terminal: bool
    exit_code: int | None = None

    @classmethod
    def from_json(cls, header: dict, data: bytes) -> LogChunk:
        """From a checked `logs` answer or `logs --stream` frame header, and the bytes it carried."""
        return cls(offset=header["offset"], next_offset=header["next_offset"], size=header["size"], data=data,
                   state=header["state"], terminal=header["terminal"], exit_code=header.get("exit_code"))

    @property
    def at_end(self) -> bool:
        """Every byte the log has now was sent."""
        return self.next_offset >= self.size
