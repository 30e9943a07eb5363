"""A sweep on Slurm (`launcher: slurm` + `sweep`): one job array, one task per variant.
Array task a runs variant a+1 as its own job (run_task); the login node reconciles each task as one job.

The job dir:
    spec.json status.json events.jsonl slurm.json cancel result.json   the array's (status: the login node's)
    variant-K/ status.json events.jsonl output.log done                 variant K's (1-based, as on one host)
    results/variant-K.json                                              variant K's RUNNER_RESULT
    halt                                                                fail_fast: why no further variant starts

One writer per file. variant-K/ is its task supervisor's until `done` exists, unless Slurm ended the task
while its supervisor could not write: then the login node writes its final status, last log line and `done`.
The array's status.json and result.json are the login node's alone, written under array.lock.

The tail: the variants' output.log files one after another. Bytes of variant K+1 are served only once
variant K is done (`done` is created after its last byte), so an offset always means the same byte and the
byte-cursor tail stays exactly-once.
"""
from __future__ import annotations

import fcntl
import os
import time
from dataclasses import asdict

from ..contract import TERMINAL
from ..host.answer import Fail
from ..supervision.files import JobPaths, append_line, read_json, read_status, write_json_atomic
from ..supervision.record import Job, initial_status
from ..supervision.variants import fit_combined, variant_record
from .allocation import run_job
from .batch import array_task_index
from .calls import SLURM_POLL_S, scancel_if_late, slurm_call, slurm_file
from .states import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    SlurmJob,
    SlurmOutputError,
    forgotten,
    parse_sacct,
    parse_squeue,
    reconcile,
    sacct_disabled,
    squeue_forgot,
)

TASK_FILES = ("status", "events", "output", "supervisor_log", "restore_log", "reserve", "restore_lock")


# ── the layout ────────────────────────────────────────────────────────────────────────────────────────

class TaskPaths(JobPaths):
    """A variant's files (task_paths), with `done`: created once the variant's log is final."""
    done: str


def task_paths(paths: JobPaths, index: int) -> TaskPaths:
    """Variant `index`'s own files (variant-K/); the spec and the cancel file stay the job's, so one cancel
    reaches every task."""
    task = TaskPaths(paths.root, paths.job_id)
    task.dir = os.path.join(paths.dir, "variant-%d" % index)
    for name in TASK_FILES:
        setattr(task, name, os.path.join(task.dir, os.path.basename(getattr(paths, name))))
    task.result = os.path.join(paths.dir, "results", "variant-%d.json" % index)
    task.done = os.path.join(task.dir, "done")
    return task


def variant_spec(spec: dict, index: int) -> dict:
    """What variant `index` runs: the job's spec with the variant's argv as its payload's, and no sweep."""
    payload = dict(spec["payload"])
    argv = list(spec["sweep"]["variants"][index - 1]["argv"])
    payload.update({"command": argv} if payload["command"] is not None else {"args": argv})
    return dict({key: value for key, value in spec.items() if key != "sweep"}, payload=payload)


def read_task(task: JobPaths):
    """A task's status.json, or None before its supervisor (or the login node) wrote one."""
    return read_status(task) if os.path.exists(task.status) else None


def close(job: Job, line: dict) -> bool:
    """The variant's last log line, then `done`. Whoever creates `closing` first (O_EXCL) closes it, so the line
    is never written twice (a task that starts just as the login node records it cancelled); False when another did."""
    try:
        os.close(os.open(os.path.join(job.paths.dir, "closing"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    job.event("variant", **line)
    job.persist(lambda: append_line(job.paths.output, dict(line, event="variant")))
    assert isinstance(job.paths, TaskPaths)  # a variant's job (run_task)
    with open(job.paths.done, "w"):
        pass
    return True


# ── the allocation: one task, one variant ────────────────────────────────────────────────────────────────

def run_task(paths: JobPaths) -> dict:
    """`slurm-run` in array task a: variant a+1 as its own job, between a `variant` start and end line."""
    spec = read_json(paths.spec)
    variants = spec["sweep"]["variants"]
    try:
        index = array_task_index(os.environ, len(variants)) + 1
    except ValueError as exc:
        raise Fail("bad-args", str(exc)) from exc
    task = task_paths(paths, index)
    for path in (task.dir, os.path.dirname(task.result)):
        os.makedirs(path, exist_ok=True)
    status = read_task(task)
    if status is not None and status["state"] in TERMINAL:  # the login node ended it while it waited
        return {"ok": True, "state": status["state"], "exit_status": 0}
    job = Job(task, variant_spec(spec, index), status or initial_status(variant_spec(spec, index)))
    head = {"index": index, "of": len(variants), "args": variants[index - 1]["args"]}
    why = not_starting(paths)
    if why:
        job.set_state("CANCELLED", "done", message=why, ended_at=time.time(), restored=True)
        close(job, dict(head, status="skipped", reason=why))
        return {"ok": True, "state": "CANCELLED", "exit_status": 0}
    began = time.monotonic()
    job.event("variant", status="start", **head)
    job.persist(lambda: append_line(task.output, dict(head, status="start", event="variant")))
    answer = run_job(job)
    seconds = round(time.monotonic() - began, 3)
    job.save(seconds=seconds)
    if job.status["state"] != "SUCCEEDED" and spec["sweep"]["fail_fast"]:
        with open(os.path.join(paths.dir, "halt"), "w") as fh:
            fh.write("not started: variant %d failed and sweep.fail_fast is set\n" % index)
    close(job, dict(head, status="end", state=job.status["state"], exit_code=job.status.get("exit_code"),
                    seconds=seconds))
    return answer


def not_starting(paths: JobPaths):
    """Why this task's variant must not start (a cancel, or fail_fast after a failed variant), or None."""
    if os.path.exists(paths.cancel):
        return "not started: cancelled on request"
    try:
        with open(os.path.join(paths.dir, "halt")) as fh:
            return fh.read().strip()
    except FileNotFoundError:
        return None


# ── the login node ────────────────────────────────────────────────────────────────────────────────────

class ArrayLock:
    """The array's status.json, result.json and the login node's writes to a task are made under it."""

    def __init__(self, paths: JobPaths) -> None:
        self.path = os.path.join(paths.dir, "array.lock")

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


def refresh(paths: JobPaths, known: dict) -> dict:
    """The array's status from each task reconciled with Slurm's view; once every variant is done, result.json
    and then the final state."""
    status = read_status(paths)
    if status["state"] in TERMINAL:
        return _answer(status, known)
    with ArrayLock(paths):
        status = read_status(paths)
        if status["state"] not in TERMINAL:
            known = _asked(paths, known)
            spec = read_json(paths.spec)
            tasks = [_task(paths, spec, index, _view(known, index))
                     for index in range(1, len(spec["sweep"]["variants"]) + 1)]
            status = _record(paths, spec, status, tasks)
            _escalate_cancel(paths, spec, known, tasks)
    return _answer(status, known)


def cancel(paths: JobPaths, known: dict) -> dict:
    """After the cancel file: scancel every task not started, SIGUSR1 to the batch step of every started one.
    Tasks that start later see the cancel file and run nothing."""
    with ArrayLock(paths):
        known = _asked(paths, dict(known, asked_at=0))
        spec, started, waiting = read_json(paths.spec), [], {}
        for index in range(1, known["array"]["variants"] + 1):
            view, task = _view(known, index), task_paths(paths, index)
            if view is None or view.state in TERMINAL or os.path.exists(task.done):
                continue
            status = read_task(task) or {}
            if status.get("supervisor"):
                started.append(view.job_id)
            else:
                waiting[index] = view
        errors = [slurm_call(argv + ids).stderr.strip()[-300:] for argv, ids in
                  ((["scancel"], [v.job_id for v in waiting.values()]),
                   (["scancel", "--batch", "--signal=USR1"], started)) if ids]
        # Slurm drops a pending task scancelled by its id from squeue and sacct alike: record it here
        for index in (k for k, view in waiting.items() if view.slurm_state == "PENDING"):
            _end_task(paths, spec, index, "CANCELLED", "cancelled while waiting in Slurm's queue")
        write_json_atomic(slurm_file(paths), dict(known, asked_at=0))  # the next look asks Slurm again
    status = refresh(paths, read_json(slurm_file(paths)))
    answer = {"state": status["state"], "slurm_job_id": known["job_id"]}
    return dict(answer, scancel="; ".join(e for e in errors if e)) if any(errors) else answer


def log_chunk(paths: JobPaths, offset: int, limit: int) -> tuple:
    n = len(read_json(paths.spec)["sweep"]["variants"])
    tasks = [task_paths(paths, index) for index in range(1, n + 1)]
    return combined_chunk([(task.output, os.path.exists(task.done)) for task in tasks], offset, limit)


def combined_chunk(segments: list, offset: int, limit: int) -> tuple:
    """(bytes from `offset`, at most `limit`; the stream's size so far) of the stream made of each segment's
    file in turn. segments: [(path, final)] in variant order; the first segment not final ends the stream
    (its bytes so far are in it, nothing after it), so bytes once served never move. Call `final` before
    the file's size is read: a final file does not grow any more."""
    data, start = b"", 0
    for path, final in segments:
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if len(data) < limit and offset < start + size:
                    fh.seek(max(0, offset - start))
                    data += fh.read(min(limit - len(data), start + size - max(offset, start)))
        except FileNotFoundError:
            size = 0
        start += size
        if not final:
            break
    return data, start


# ── the login node: one task ────────────────────────────────────────────────────────────────────────────

def _task(paths: JobPaths, spec: dict, index: int, view) -> dict:
    """One task as the array counts it; a task Slurm ended while its supervisor could not write is ended here."""
    task = task_paths(paths, index)
    status = read_task(task)
    if not os.path.exists(task.done):
        recorded = (status or {}).get("state", "QUEUED")
        started = (status or {}).get("supervisor") is not None
        state, message = reconcile(recorded, started, view)
        if state in TERMINAL and state != recorded:
            status = _end_task(paths, spec, index, state, message)
        elif recorded in TERMINAL and view is not None and view.state in TERMINAL:  # died before `done`
            _close_for(Job(task, spec, status), spec, index)
        if view is not None and view.state in TERMINAL and os.path.isdir(task.dir):
            with open(task.done, "a"):  # Slurm ended the task: whoever was closing it is gone
                pass
    closed = os.path.exists(task.done)
    status = status or {"state": "QUEUED"}
    state = status["state"]
    if state == "QUEUED" and view is not None and view.state != "QUEUED":
        state = "RUNNING"  # allocated: its supervisor is starting
    return {"index": index, "state": state, "closed": closed, "skipped": closed and _skipped(status),
            "reason": view.reason if state == "QUEUED" and view is not None else None, "status": status}


def _end_task(paths: JobPaths, spec: dict, index: int, state: str, message: str) -> dict:
    """A task Slurm ended while its supervisor could not write (or the login node's cancel took out of the
    queue): its final status, its last log line, `done`."""
    task = task_paths(paths, index)
    os.makedirs(task.dir, exist_ok=True)  # a task that never started has none yet
    job = Job(task, spec, read_task(task) or initial_status(variant_spec(spec, index)))
    if not job.terminal:
        job.set_state(state, "done", message=message, ended_at=time.time(), restored=True)
    _close_for(job, spec, index)
    return job.status


def _close_for(job: Job, spec: dict, index: int) -> bool:
    variants, status = spec["sweep"]["variants"], job.status
    head = {"index": index, "of": len(variants), "args": variants[index - 1]["args"]}
    if _skipped(status):
        return close(job, dict(head, status="skipped", reason=status.get("message")))
    return close(job, dict(head, status="end", state=status["state"], exit_code=status.get("exit_code"),
                           seconds=status.get("seconds"), reason=status.get("message")))


def _skipped(status: dict) -> bool:
    """Never ran its payload: cancelled (or held back by fail_fast) before its supervisor started it."""
    return status["state"] == "CANCELLED" and status.get("supervisor") is None


# ── the login node: the array ─────────────────────────────────────────────────────────────────────────

def array_progress(tasks: list) -> dict:
    """{of, done, succeeded, failed, skipped, running, pending, reasons}: `done` variants have their final
    record; `pending` ones wait in Slurm's queue, `reasons` counts Slurm's reasons among them."""
    done = [t for t in tasks if t["closed"]]
    pending = [t for t in tasks if not t["closed"] and t["state"] == "QUEUED"]
    succeeded = sum(1 for t in done if t["state"] == "SUCCEEDED")
    skipped = sum(1 for t in done if t.get("skipped"))
    reasons: dict[str, int] = {}
    for t in pending:
        if t.get("reason"):
            reasons[t["reason"]] = reasons.get(t["reason"], 0) + 1
    return {"of": len(tasks), "done": len(done), "succeeded": succeeded, "failed": len(done) - succeeded - skipped,
            "skipped": skipped, "running": len(tasks) - len(done) - len(pending), "pending": len(pending),
            "reasons": reasons}


def sweep_outcome(records: list, cancel_requested: bool) -> tuple:
    """(state, message, exit_code) of an array whose variants are all done, as a sweep on one host ends:
    SUCCEEDED only if every variant did; CANCELLED on request or when Slurm cancelled every other one; else FAILED."""
    n = len(records)
    ok = sum(1 for r in records if r["state"] == "SUCCEEDED")
    skipped = sum(1 for r in records if r["status"] == "skipped")
    message = "sweep: %d succeeded, %d failed, %d skipped of %d variants" % (ok, n - ok - skipped, skipped, n)
    if ok == n:
        return "SUCCEEDED", message, 0
    others = [r for r in records if r["state"] != "SUCCEEDED"]
    if cancel_requested or all(r["state"] == "CANCELLED" for r in others):
        return "CANCELLED", ("cancelled on request; " if cancel_requested else "Slurm cancelled it; ") + message, 1
    odd = ["variant %d %s" % (r["index"], r["state"]) for r in others if r["state"] not in ("FAILED", "CANCELLED")]
    return "FAILED", message + ("; " + ", ".join(odd) if odd else ""), 1


def _record(paths: JobPaths, spec: dict, status: dict, tasks: list) -> dict:
    """The array's status.json from its tasks; result.json first once every variant is done."""
    job = Job(paths, spec, status)
    progress = array_progress(tasks)
    if progress["done"] == progress["of"]:
        records = [_variant(paths, spec, t) for t in tasks]
        state, message, exit_code = sweep_outcome(records, os.path.exists(paths.cancel))
        summary = {"variants": progress["of"], "succeeded": progress["succeeded"], "failed": progress["failed"],
                   "skipped": progress["skipped"]}
        write_json_atomic(paths.result, {"payload": "sweep", "sweep": summary,
                                         "variants": fit_combined(paths.dir, records)})
        job.set_state(state, "done", message=message, exit_code=exit_code, array=progress, sweep=summary,
                      ended_at=time.time(), restored=True)
        return job.status
    state = "QUEUED" if progress["pending"] == progress["of"] else "RUNNING"
    phase = "array: %d of %d done, %d running, %d pending" % (
        progress["done"], progress["of"], progress["running"], progress["pending"])
    message = ", ".join(progress["reasons"]) if state == "QUEUED" else ""
    if state != status["state"]:
        job.set_state(state, phase, message=message, array=progress,
                      **({"started_at": time.time()} if state == "RUNNING" else {}))
    elif (progress, phase, message) != (status.get("array"), status.get("phase"), status.get("message")):
        job.save(array=progress, phase=phase, message=message)
    return job.status


def _variant(paths: JobPaths, spec: dict, task: dict) -> dict:
    status, index = task["status"], task["index"]
    reason = None if status["state"] == "SUCCEEDED" else status.get("message")
    record = variant_record(index, spec["sweep"]["variants"][index - 1]["args"],
                            "skipped" if task["skipped"] else "ended", status.get("exit_code"),
                            status.get("seconds"), reason, task_paths(paths, index).result)
    return dict(record, state=status["state"])


def _escalate_cancel(paths: JobPaths, spec: dict, known: dict, tasks: list) -> None:
    if known.get("scancel_at") or not os.path.exists(paths.cancel) or all(t["closed"] for t in tasks):
        return
    scancel_if_late(paths, read_json(slurm_file(paths)), spec["limits"]["grace"])  # the whole array


def _answer(status: dict, known: dict) -> dict:
    option = "--array=0-%d%%%d" % (known["array"]["variants"] - 1, known["array"]["max_parallel"])
    return dict(status, slurm={"job_id": known["job_id"], "array": option, "state": None, "reason": None,
                               "node": None, "cuda_visible_devices": None, "error": known.get("error")})


# ── asking Slurm about every task at once ─────────────────────────────────────────────────────────────

def _view(known: dict, index: int):
    view = (known.get("views") or {}).get(str(index))
    return SlurmJob(**view) if view else None


def _asked(paths: JobPaths, known: dict) -> dict:
    """slurm.json with a view of every task at most SLURM_POLL_S old (asking Slurm when it is older)."""
    if time.time() - known.get("asked_at", 0) < SLURM_POLL_S:
        return known
    views, error = ask(known["job_id"], known["array"]["variants"])
    known = dict(known, asked_at=time.time(), views={str(k): asdict(v) for k, v in views.items()} or
                 known.get("views"), error=error)
    write_json_atomic(slurm_file(paths), known)
    return known


def ask(slurm_job_id: str, variants: int) -> tuple:
    """({variant index: SlurmJob}, error or None): `squeue -r` first; sacct for the tasks slurmctld no longer lists
    (those that never started in one range, in full with SLURM_BITSTR_LEN=0); a task neither knows is `forgotten`."""
    wanted = {"%s_%d" % (slurm_job_id, k - 1): k for k in range(1, variants + 1)}
    done = slurm_call(["squeue", "-h", "-r", "-t", "all", "-j", slurm_job_id, "-o", SQUEUE_FORMAT])
    try:
        if done.returncode == 0:
            lines = parse_squeue(done.stdout)
            found = {i: view for i, view in ((i, _task_view(i, lines, slurm_job_id)) for i in wanted) if view}
        elif squeue_forgot(done.returncode, done.stderr):
            found = {}
        else:
            return {}, "squeue: " + (done.stderr.strip()[-300:] or "exit %d" % done.returncode)
        if set(wanted) - set(found):
            done = slurm_call(["sacct", "-n", "-P", "-X", "-j", slurm_job_id, "-o", SACCT_FIELDS],
                          env=dict(os.environ, SLURM_BITSTR_LEN="0"))
            if sacct_disabled(done.returncode, done.stderr):
                rows = {}
            elif done.returncode != 0:
                return {wanted[i]: v for i, v in found.items() if i in wanted}, \
                    "sacct: " + (done.stderr.strip()[-300:] or "exit %d" % done.returncode)
            else:
                rows = parse_sacct(done.stdout)
            said = done.stderr.strip()[-300:] or "no record of it"
            found.update({i: _task_view(i, rows, slurm_job_id) or forgotten(i, said) for i in wanted if i not in found})
    except SlurmOutputError as exc:
        return {}, str(exc)
    return {wanted[i]: view for i, view in found.items() if i in wanted}, None


def _task_view(task_id: str, views: dict, slurm_job_id: str):
    """A task's own line, else the array's bare id: the record of its tasks that never started (squeue and
    sacct print it so once the last of them left the queue, e.g. `123|CANCELLED`)."""
    view = views.get(task_id) or views.get(slurm_job_id)
    return SlurmJob(**dict(asdict(view), job_id=task_id)) if view else None
