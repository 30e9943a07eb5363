"""What each command does to one job, as plain functions returning plain data (cli.py only prints and exits):
its plan, submit (and `--dry-run`), tail, status, cancel and result; `connect` reaches its host.

Every operation is one or a few short round trips; none holds a step of the job's choreography.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from contextlib import ExitStack, closing, suppress
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from remote_payload import sweep as sweeps
from remote_payload.contract import DEFAULTS, is_terminal

from ..deadline import Deadline
from ..errors import (
    AuthFailed,
    HostKeyError,
    LocalStateError,
    LogShrank,
    PreflightError,
    RemoteError,
    RunnerError,
    SpecError,
    TransportError,
    UnknownJob,
    UploadCut,
    first_line,
)
from ..remote import preflight
from ..remote.answers import LogChunk
from ..remote.bundles import Bundle, packaged_payload, payload_bundle, payload_dir, payload_files, supervisor_bundle
from ..remote.host import HostClient
from ..remote.job_answers import JobStatus, Result, Started
from ..remote.transport_openssh import for_host
from ..state.job_id import check_job_id, job_id_for
from ..state.store import NOT_STARTED, JobRecord, Store
from . import render
from .interrupts import Interrupts
from .plan import PLANNED_JOB_ID, DryRun, Plan, Submitted

if TYPE_CHECKING:  # pydantic, yaml and tenacity load only in the commands that use them (`runner tail` starts fast)
    from tenacity import Retrying

    from ..spec.payload_args import ArgsCheck
    from ..spec.spec import JobSpec

LOG_CHUNK = 1 << 20
# How long a submit's host call may go on after the submit itself ended (killed, or left on a second Ctrl-C: its
# ssh runs in a session of its own): the host's start handshake (30 s) and its bounded commands, with room.
HOST_CALL_OUTLIVES_S = 90.0
LONG_POLL_S = 5.0


class ByteSink(Protocol):
    """Where `tail` writes a log's bytes: a binary stream, or what renders them (watch, a fleet's prefixes)."""

    def write(self, data: bytes, /) -> object: ...

    def flush(self) -> object: ...


@dataclass
class TailOutcome:
    job_id: str
    state: str
    exit_code: int | None
    terminal: bool
    offset: int
    printed: int
    busy: bool = False  # another tail of this job held its cursor for all of max_wait: nothing printed


def connect(host: dict, bundle: Bundle | None = None, *, deadline: Deadline,
            payload: Bundle | None = None) -> HostClient:
    """A client for the host section of a spec, as `with connect(host, deadline=…) as client:`. deadline: the
    command's own (its front end's), which no call may outlive; bundle: the supervisor's (built when not
    given); payload: the job's payload bundle, for the calls that name it."""
    if isinstance(host["address"], list):
        raise SpecError("host.address is a list of hosts (a fleet): this command takes one host",
                        hint="Submit the fleet with `runner submit JOB.yaml`; give --host H for one of its hosts.")
    transport = for_host(host)
    if bundle is None:
        bundle = supervisor_bundle()
    return HostClient(transport, root=host.get("root", DEFAULTS["host.root"]), python=host.get("python", "python3"),
                      bundle=bundle, deadline=deadline, payload=payload)


RETRY_ATTEMPTS = 3
RETRY_FIRST_WAIT_S, RETRY_MAX_WAIT_S = 0.2, 2.0  # doubled after each failed attempt, up to the max


def _retrying(deadline: Deadline) -> Retrying:
    """`_retrying(deadline)(fn, *args, **kwargs)`: fn's answer, its call repeated while it fails on a lost link.
    For idempotent calls only (never a refused host key or login, nor a bad answer), inside the command's
    deadline: no retry starts once it passed, no back-off sleeps past it. Three attempts, 0.2 s and 0.4 s apart.
    tenacity is imported here: a tail, which retries nothing, does not load it."""
    from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

    backoff = wait_exponential(multiplier=RETRY_FIRST_WAIT_S, max=RETRY_MAX_WAIT_S)
    attempts = stop_after_attempt(RETRY_ATTEMPTS)
    return Retrying(retry=retry_if_exception(lambda e: isinstance(e, TransportError) and e.retry),
                    stop=lambda state: attempts(state) or deadline.passed(),
                    wait=lambda state: min(backoff(state), deadline.left()), reraise=True)


# -- submit -----------------------------------------------------------------------------------------------

def required_mib(spec: JobSpec, check: ArgsCheck | None) -> int:
    """gpu.min_free_mib, or with `auto` the payload's own estimate (its estimate_peak_bytes, asked in the args
    check's child: a sweep's largest variant decides)."""
    if spec.gpu.min_free_mib != "auto":
        return int(spec.gpu.min_free_mib)
    variants = len(spec.variant_args())
    estimates = (check.estimates[-variants:] if variants else check.estimates[:1]) if check and check.checked else []
    if not estimates or None in estimates:
        script = spec.payload.script
        why = f" ({check.estimate_problem})" if check and check.estimate_problem else ""
        raise SpecError(f"{spec.spec_path}: gpu.min_free_mib: `auto` needs a payload script whose parse_args and "
                        f"estimate_peak_bytes(args) answer on the controller ({script or 'a command'} does not"
                        f"{why}); give a number of MiB")
    return -(-max(e for e in estimates if e is not None) // (1 << 20))


def _check_payload_args(spec: JobSpec, source: Path | None) -> ArgsCheck | None:
    """A script's args are checked against its own parser before any host is contacted (exit 2 naming the key);
    the same child answers the script's estimates: the job's run first, a sweep's variants last."""
    if source is None:
        return None
    from ..spec.payload_args import check_many

    runs = [(spec.payload.args, spec.payload_args(), "payload.args")]
    merged = spec.prepare_args_merged()
    if merged is not None:  # the prepare run's args are the script's too: checked alike
        runs.append((merged, spec.payload_args(merged), "payload.args"))
    matrix = spec.sweep.matrix if spec.sweep is not None else {}
    for variant, full in zip(spec.sweep.variants() if spec.sweep else [], spec.variant_args()):
        runs.append((variant, spec.payload_args(full), "sweep.matrix" if set(variant) <= set(matrix) else "sweep.include"))
    return check_many(source, runs, spec.spec_path)


def local_plan(spec_path: str, overrides: Sequence[str]) -> Plan:
    """The command's plan of this spec: validated, its payload args checked, both bundles built — once."""
    from ..spec.spec_fleet import RolloutSpec
    from ..spec.spec_load import load_spec

    spec = load_spec(spec_path, overrides)
    script = spec.payload.script
    source = spec.script_source(packaged_payload(script) or payload_dir() / "payloads") if script else None
    check = _check_payload_args(spec, source)
    args_note = check.note if check else "payload is a command: its arguments are passed as written"
    files = payload_files(spec.payload.files, spec.spec_dir, source) if source is not None else {}
    payload = payload_bundle(source, files) if source is not None else None
    wire = spec.to_wire(PLANNED_JOB_ID, required_mib(spec, check), source.name if source else None)
    if payload is not None:  # the host runs the script from ROOT/payloads/<this digest>/
        wire["payload"]["bundle"] = payload.digest
    rollout = (spec.rollout or RolloutSpec()).model_dump() if isinstance(spec.host.address, list) else None
    return Plan(str(Path(spec_path).resolve()), tuple(overrides), spec.host.model_dump(), supervisor_bundle(), wire,
                args_note, rollout, payload, spec.metrics.model_dump() if spec.metrics else None)


def _wire(plan: Plan, job_id: str | None) -> dict:
    """The plan's wire form with this submit's job id: the one given, else a new one."""
    job_id = check_job_id(job_id) if job_id is not None else job_id_for(plan.name, datetime.now(timezone.utc), os.urandom(3).hex())
    return plan.wire_for(job_id)


def submit(spec_path: str, overrides: list[str], *, queue: bool = False, job_id: str | None = None,
           store: Store, progress: Callable[[str], None], planned: Plan | None = None,
           deadline: Deadline, interrupts: Interrupts | None = None) -> Submitted:
    """Plan, record the job locally (its id chosen here), then preflight and start it on the host. The record
    comes first, so whatever fails later (the link, the state dir) leaves a job `status`/`cancel` can name;
    a refusal from the host removes the record it made. planned: the command's plan of this spec (the CLI's,
    or a fleet's retargeted to this host), else it is made here; deadline: the command's; interrupts: the
    CLI's, which hold a Ctrl-C or SIGTERM until the host answered and then cancel the job (interrupts.py)."""
    store.check_writable()
    plan = planned if planned is not None else local_plan(spec_path, overrides)
    host, bundle = plan.host, plan.bundle
    wire = _wire(plan, job_id)
    job_id = wire["job_id"]
    progress(plan.args_note)
    record = JobRecord(job_id=job_id, name=wire["name"], host=host, spec_path=plan.spec_path,
                       submitted_at=time.time(), service=wire.get("service") or {"services": wire["services"]}, wire=wire,
                       metrics=plan.metrics or {}, submit_until=time.time() + deadline.left() + HOST_CALL_OUTLIVES_S)
    with (interrupts or Interrupts()).held(job_id, host["address"], progress) as held:
        made_record = _record(store, record)
        unstarted = made_record or store.load(job_id).last_state == NOT_STARTED  # no host has this job yet
        client = None
        try:
            client = connect(host, bundle, deadline=deadline, payload=plan.payload_bundle)
            with client:
                progress(f"preflight on {host['address']} …")
                answer, already = _submit_once(client, wire, queue)
                for note in answer.notes:
                    progress(note)
                held.cancel_if_interrupted(client, already)
        except TransportError as exc:
            if unstarted and (client is None or not getattr(client.transport, "reached", True)):
                raise _not_started(store, job_id, exc) from exc
            if isinstance(exc, (HostKeyError, AuthFailed)):  # refused before anything ran
                raise
            if isinstance(exc, UploadCut):  # before any start: the same job id goes on with the upload
                raise UploadCut(str(exc), hint=f"{exc.hint} Nothing was started: submit again with --job-id {job_id}."
                                ) from exc
            again = (f"The job may have started: `runner status {job_id}` tells; submitting again with --job-id "
                     f"{job_id} never starts it twice.")
            raise type(exc)(str(exc), hint=f"{exc.hint} {again}".strip()) from exc
        except RunnerError:
            if made_record:
                store.forget(job_id)  # the host refused it: never started
            raise
    if not (made_record and answer.state == record.last_state):
        _note_state(store, job_id, answer.state, progress)
    return Submitted(job_id, answer.state, host["address"], answer.stop_service, list(answer.notes),
                     client.round_trips, already, answer.slurm_job_id)


def _not_started(store: Store, job_id: str, exc: TransportError) -> TransportError:
    """A submit whose every call failed before reaching the host: its record ends NOT_STARTED, saying why."""
    why = f"never started: {first_line(exc)}"
    with suppress(LocalStateError):  # the error to report is the host's; the record stays as it was
        store.end_not_started(job_id, why)
    return type(exc)(str(exc), hint=f"{exc.hint} Nothing was started (the host was never reached); `runner list` "
                                    f"shows {job_id} NOT_STARTED.".strip())


def _record(store: Store, record: JobRecord) -> bool:
    """Save the job's record unless one exists (a resubmit keeps its cursor). Whether this made it."""
    try:
        store.load(record.job_id)
        return False
    except UnknownJob:
        pass
    store.save(record)  # a state dir that cannot be written: LocalStateError
    return True


def _note_state(store: Store, job_id: str, state: str, progress: Callable[[str], None]) -> None:
    """Record the state the host answered; the record's last_state is only a cache, so a state dir that broke
    after the start costs a note, not the job id the caller needs."""
    try:
        store.update_state(job_id, state)
    except LocalStateError as exc:
        progress(f"warning: the job's state was not recorded: {exc}")


def dry_run(spec_path: str, overrides: list[str], *, queue: bool = False, job_id: str | None = None,
            planned: Plan | None = None, deadline: Deadline) -> DryRun:
    """Validate, check the args, preflight the host and decide — without starting or changing anything.
    A refusal raises exactly what submit would raise (exit 2/3/4/5). planned, deadline: as for submit."""
    plan = planned if planned is not None else local_plan(spec_path, overrides)
    host, bundle, wire, args_note = plan.host, plan.bundle, _wire(plan, job_id), plan.args_note
    with connect(host, bundle, deadline=deadline, payload=plan.payload_bundle) as client:
        report = _preflight(client, wire)
    decision = preflight.decide(wire, report, queue=queue)
    payload = wire["payload"]
    argv = payload["command"] or [payload["python"], payload["script"], *payload["args"]]
    queued = [f"--queue: waits at most {wire['limits']['queue_timeout']:.0f} s for the locks (limits.queue_timeout), "
              "then ends TIMED_OUT with nothing stopped"] if queue else []
    return DryRun(wire["job_id"], host["address"], decision.stop_service, wire["gpu"]["required_mib"], argv,
                  [args_note, *decision.notes, *queued], report.get("gpus", []), report.get("service"),
                  (wire.get("sweep") or {}).get("variants", []), (wire.get("sweep") or {}).get("max_parallel"),
                  _slots(wire), render.dry_run_steps(wire, argv, decision.stop_service), _bundle_view(plan.payload_bundle))


def _bundle_view(bundle: Bundle | None) -> dict | None:
    if bundle is None:
        return None
    return {"files": len(bundle.entries), "bytes": bundle.size, "digest": bundle.digest}


def _slots(wire: dict) -> list[list[str]] | None:
    """The side-by-side slots of a sweep with gpus_per_variant, as the host will cut them; else None."""
    per_variant = (wire.get("sweep") or {}).get("gpus_per_variant")
    return None if per_variant is None else sweeps.slots(wire["gpu"]["devices"], per_variant)


def _submit_once(client: HostClient, wire: dict, queue: bool) -> tuple[Started, bool]:
    """One `submit` call: the host decides (remote_payload/admission.py) and starts the job or refuses it. The
    answer, and whether it adopted a job this id started before. A lost call asks whether the job exists
    before submitting again (never twice)."""
    try:
        return _submit_call(client, wire, queue)
    except TransportError as exc:
        if not exc.retry:  # a refused key or login, an answer outside the contract: asking again changes nothing
            raise
        client.close()
        found = _retrying(client.deadline)(client.status, [wire["job_id"]])
        if found and found[0].state != "UNKNOWN":
            return Started.found(found[0]), False
        return _submit_call(client, wire, queue)


def _submit_call(client: HostClient, wire: dict, queue: bool) -> tuple[Started, bool]:
    """The host's verdict as the controller's outcome: started, adopted (`exists`), or the refusal raised."""
    try:
        return client.submit(wire, queue=queue), False
    except RemoteError as exc:
        if exc.code == "exists":
            return _adopt(client, wire, exc), True
        if exc.answer.get("stage") in ("preflight", "admit") or exc.code in ("bad-spec", "bad-args"):
            raise _refusal(exc) from exc
        raise


def _preflight(client: HostClient, wire: dict) -> dict:
    """The host's own refusal (systemd unreachable, sudo wants a password …) is a preflight refusal: exit 4."""
    try:
        return _retrying(client.deadline)(client.preflight, wire)
    except RemoteError as exc:
        raise _refusal(exc) from exc


def _refusal(exc: RemoteError) -> SpecError | PreflightError:
    """The admission's own refusals are PreflightError already (HostClient); these are the host's others."""
    if exc.code in ("bad-spec", "bad-args"):
        return SpecError(f"the host refused the spec: {exc}")
    return PreflightError(f"{exc}", hint=exc.hint)


def _adopt(client: HostClient, wire: dict, exc: RemoteError) -> Started:
    """The job this id already names on the host: its status when it is the same spec (a retried submit)."""
    if exc.answer.get("same_spec") is False:
        raise SpecError(f"job id {wire['job_id']} is already used on this host by a different spec",
                        hint="Resubmit the same spec to adopt that job, or choose another --job-id.") from None
    return Started.found(client.status([wire["job_id"]])[0])


# -- tail -------------------------------------------------------------------------------------------------

def tail(job_id: str, *, store: Store, out: ByteSink, follow: bool, max_wait: float, from_start: bool,
         save_cursor: bool = True, delivered: Callable[[TailOutcome], None] = lambda _o: None,
         on_wait: Callable[[], None] = lambda: None) -> TailOutcome:
    """Print log bytes after the stored cursor; with follow, until terminal or max_wait. Never past max_wait
    plus one round trip's allowance (the client's deadline).

    The cursor moves only when the call ends by itself: once, after the last chunk was flushed to `out` and
    `delivered(outcome)` (the caller's last step, e.g. printing the --json document) returned. A call killed at
    any point leaves it where it was: its bytes come again, and the calls that end by themselves join to the log
    byte for byte. The call holds the job's cursor turn from reading the cursor to saving it, so two tails of
    one job take turns (`on_wait()` when it must wait; busy, "call again", when max_wait passes first). Bytes
    printed before a host error end the call normally; the error comes with the next call. A host log shorter
    than the cursor resets it to 0 and raises LogShrank (exit 3): bytes may repeat, none is skipped.
    save_cursor=False (watch): a reader of its own that neither takes the turn nor writes the record.
    """
    waiting = Deadline(max_wait)
    job_id = check_job_id(job_id)
    if not save_cursor:
        record = store.load(job_id)
        cursor = 0 if from_start else record.cursor
        with ExitStack() as stack:
            outcome = _print_log(record, cursor, open_log(record, cursor, follow, waiting, stack), out)
        delivered(outcome)
        return outcome
    with ExitStack() as stack:
        record, turn = stack.enter_context(store.cursor_turn(job_id, waiting.left(), on_wait))
        if not turn:
            outcome = TailOutcome(job_id, record.last_state, None, False, record.cursor, 0, busy=True)
            delivered(outcome)
            return outcome
        cursor = 0 if from_start else record.cursor
        try:
            with ExitStack() as call:
                outcome = _print_log(record, cursor, open_log(record, cursor, follow, waiting, call), out)
        except RemoteError as exc:
            if exc.code != "bad-offset":
                raise
            raise log_shrank(record, exc.answer.get("size"), store) from None
        delivered(outcome)
        if (outcome.offset, outcome.state) != (record.cursor, record.last_state):  # else there is nothing to save
            store.advance_cursor(job_id, outcome.offset, outcome.state)
        return outcome


def log_shrank(record: JobRecord, size: int | None, store: Store) -> LogShrank:
    """The host's log is shorter than the cursor: reset the cursor to 0 (the caller holds the turn). Not to
    its size: a log cut and written again would then lose its first bytes without a word; from 0 nothing is
    skipped, and the message says bytes may come again."""
    store.rewind_cursor(record.job_id)
    return LogShrank(
        f"the log of {record.job_id} is {size if size is not None else '?'} bytes, shorter than the cursor "
        f"{record.cursor}: it shrank or was replaced on the host; the cursor is reset to 0",
        hint=f"the next `runner tail {record.job_id}` prints the log from its first byte (bytes may come again).")


def _print_log(record: JobRecord, cursor: int, chunks: Iterable[LogChunk], out: ByteSink) -> TailOutcome:
    """The log's chunks from `cursor` (open_log), each written and flushed to `out` as it comes; the outcome's
    offset is past the last byte flushed."""
    job_id, printed = record.job_id, 0
    state, code, terminal = record.last_state, None, False
    try:
        for chunk in chunks:
            if chunk.data:
                out.write(chunk.data)
                out.flush()
                printed += len(chunk.data)
            cursor, state, code = chunk.next_offset, chunk.state, chunk.exit_code
            terminal = chunk.terminal and chunk.at_end
    except RunnerError:
        if not printed:
            raise
        # What this call printed is delivered: report "call again" so the caller (a --json caller
        # too) gets those bytes now and the cursor moves past them; the next call meets the error.
        return TailOutcome(job_id, state, None, False, cursor, printed)
    return TailOutcome(job_id, state, code, terminal, cursor, printed)


def open_log(record: JobRecord, cursor: int, follow: bool, waiting: Deadline, stack: ExitStack) -> Iterable[LogChunk]:
    """The job's log from `cursor` until the call may end, as chunks: streamed on one host call for as long as
    max_wait allows, where the transport streams (the call opened here, before the first chunk is asked
    for); else a `logs` call per chunk. Either way a backlog is drained never past max_wait: the rest comes
    with the next call. `stack` closes the call and its connection."""
    client = stack.enter_context(connect(record.host, deadline=Deadline.for_command(waiting.left())))
    stream = getattr(client, "log_stream", None)  # a test's scripted host answers `logs` only
    frames = stream(record.job_id, cursor, frame_bytes=LOG_CHUNK, wait=max(0.0, waiting.left() - 0.2),
                    follow=follow) if stream is not None else None
    if frames is not None:
        stack.callback(frames.close)
        return frames
    return stack.enter_context(closing(_polled_chunks(client, record.job_id, cursor, follow, waiting)))


def _polled_chunks(client: HostClient, job_id: str, cursor: int, follow: bool,
                   waiting: Deadline) -> Generator[LogChunk, None, None]:
    while True:
        wait = max(0.0, min(LONG_POLL_S, waiting.left() - 0.2)) if follow else 0.0
        chunk = client.logs(job_id, cursor, max_bytes=LOG_CHUNK, wait=wait)
        yield chunk
        cursor = chunk.next_offset
        if (chunk.at_end and (chunk.terminal or not follow)) or waiting.left() <= 0.25:
            return


# -- status, list, cancel, results, restore ---------------------------------------------------------------

def status(job_ids: list[str], *, store: Store, deadline: Deadline, every: bool = False,
           wait: float = 0.0) -> list[JobStatus]:
    """The jobs named, else the recent ones and those not yet ended, or with `every` all the jobs this controller
    knows; one host call per host. wait: how long each host may hold its answer until one of its jobs changes
    state or ends. A job whose host was not asked (never started there, or not reached) is its last known state."""
    records = [store.load(check_job_id(j)) for j in job_ids] if job_ids else store.all() if every else store.recent()[0]
    by_host: dict[tuple, list[JobRecord]] = {}
    answers: list[JobStatus] = []
    for record in records:
        if record.last_state == NOT_STARTED:  # its host never heard of it: nothing to ask
            answers.append(JobStatus.last_known(record.job_id, NOT_STARTED, record.note))
        else:
            by_host.setdefault(host_key(record.host), []).append(record)
    for group in by_host.values():
        try:
            with connect(group[0].host, deadline=deadline) as client:
                found = _retrying(deadline)(client.status, [r.job_id for r in group], wait=wait)
        except TransportError as exc:
            if job_ids:
                raise  # the jobs asked for by id: their host's error is the answer
            answers.extend(_unreached(record, exc) for record in group)  # one host's error, not every job's
            continue
        for record, job in zip(group, found):
            job = _kept_once_ended(store, record.job_id, job)
            if job.state == "UNKNOWN" and record.last_state in ("QUEUED", "UNKNOWN") and time.time() > record.submit_until:
                job = _never_reached(store, record)
            elif job.state != record.last_state:
                _note_state(store, record.job_id, job.state, lambda _note: None)
            answers.append(job)
    return answers


def _kept_once_ended(store: Store, job_id: str, job: JobStatus) -> JobStatus:
    """An ended job's final status is kept in the state dir; once the host's retention deleted the job (the host
    answers UNKNOWN), that kept status is the answer."""
    if is_terminal(job.state) and job.state != "UNKNOWN":
        store.keep(job_id, "status", job.raw)
    kept = store.kept(job_id, "status") if job.state == "UNKNOWN" else None
    return JobStatus.from_json(kept) if kept else job


def _never_reached(store: Store, record: JobRecord) -> JobStatus:
    """A job its host does not have, whose record was made by a submit none of whose host calls can still start
    it (past submit_until) and never heard of since (a submit killed, SIGKILL included, before its host call
    reached the host): it ends NOT_STARTED."""
    why = "never started: its host has no such job (its submit ended before reaching the host, or the job was removed)"
    with suppress(LocalStateError):
        store.end_not_started(record.job_id, why)
    return JobStatus.last_known(record.job_id, NOT_STARTED, why)


def _unreached(record: JobRecord, exc: TransportError) -> JobStatus:
    """A job whose host did not answer: its last known state, and why there is no newer one."""
    return JobStatus.last_known(record.job_id, record.last_state, error=exc.code,
                                message=f"host {record.host.get('address')} unreachable: {first_line(exc)}")


def host_key(host: dict) -> tuple:
    """What tells one host (and login, and root) from another: the jobs of one are asked in one call."""
    return (host["address"], host.get("user"), host.get("port"), host.get("root"))


def cancel(job_id: str, *, store: Store, deadline: Deadline) -> dict:
    record = store.load(check_job_id(job_id))
    with connect(record.host, deadline=deadline) as client:
        return client.cancel(job_id)


def result(job_id: str, *, store: Store, deadline: Deadline) -> Result:
    """The job's result; an ended job's is kept in the state dir once fetched, and answers when the host's
    retention has deleted the job since."""
    record = store.load(check_job_id(job_id))
    try:
        with connect(record.host, deadline=deadline) as client:
            found = _retrying(client.deadline)(client.result, job_id)
    except UnknownJob:
        kept = store.kept(job_id, "result")
        if kept is None:
            raise
        return Result.from_json(kept)
    if is_terminal(record.last_state):
        store.keep(job_id, "result", {"result": found.value, "windows": [{"unit": u, "window": w}
                                                                        for u, w in found.windows]})
    return found
