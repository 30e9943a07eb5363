"""Every job's payload on the host: its variants inside the one window supervise() opened (one stop and drain
before, one restore after). A plain job is a list of one variant (sweep.job_variants) under the same rules; only
its presentation differs (`plain`): RUNNER_RESULT is result.json itself, and no variant is announced.

The devices are cut into slots (sweep.slots); each runs one variant at a time with its own CUDA_VISIBLE_DEVICES
and RUNNER_GPU_SLOT, and takes the next when it ends. Each variant is its own process (RUNNER_RESULT:
results/variant-K.json), announced by a `variant` event echoed into output.log (`runner tail`, progress.py);
side by side, status.json's `slots` and the ledger name each busy slot's process for a restorer. A failing
variant stops the others only under sweep.fail_fast (no new one starts).

The window (limits.max_downtime) counts from the first stop of the job's services (else the run's start). A
variant starts only if it could end inside it (the longest so far fits; the first ones while any is left),
else it is SKIPPED with the reason; every variant ends by the window's end.

A job's end is decided once, the moment it is known (decide_ending: TERMINATING with `ending` {state, message,
at} before any process gets its TERM), so a restorer taking over records that state and gives only what is
left of the grace. A cancel or a signal stops every running variant and starts no other; one that comes after
the last variant exited 0, while only its group is being stopped, changes nothing.
"""
from __future__ import annotations

import json
import os
import select
import signal
import time

from ..contract import MAX_RESULT_BYTES
from ..host.processes import KILL_CONFIRM_S, POLL_S, group_alive
from ..sweep import job_variants, label
from . import ledger, services, stage
from .files import UnsafeResult, append_line, file_digest, open_result, parse_bounded, write_json_atomic
from .payload import interrupt_after_exit, interrupt_of, launch_payload, note_in_ledger, payload_argv, record_exit
from .record import Flags, Interrupted, Job

INLINE_RESULT_BYTES = 4 << 20      # a variant's result larger than this stays in its file, listed by name
COMBINED_RESULT_BYTES = MAX_RESULT_BYTES // 2  # a sweep's result.json, all inlined results together
DIGEST_MAX_BYTES = 1 << 30         # a listed file larger than this is not hashed (the time is the window's)


def plain(job: Job) -> bool:
    """A job without a sweep: its one variant is presented as the payload itself."""
    return not job.spec.get("sweep")


def announce(job: Job, index: int, of: int, variant: dict, status: str, **extra) -> None:
    """A sweep's boundary: an event in events.jsonl and the same line in the log (a plain job has none)."""
    if plain(job):
        return
    fields = dict(index=index, of=of, args=variant["args"], status=status, **extra)
    job.event("variant", **fields)
    job.persist(lambda: append_line(job.paths.output, dict(fields, event="variant")))


def result_path(job: Job, index: int) -> str:
    """The variant's RUNNER_RESULT: result.json for a plain job, results/variant-K.json in a sweep."""
    return job.paths.result if plain(job) else os.path.join(job.paths.dir, "results", "variant-%d.json" % index)


def window_start(job: Job) -> tuple:
    """(when the window opened, whether a stop opened it): the first stop of the job's services, else now."""
    stops = [s["stopped_at"] for s in services.records(job.status) if s.get("stopped_at")]
    return (min(stops), True) if stops else (time.time(), False)


def decide_ending(job: Job, state: str, message: str) -> None:
    """The job's end, recorded once (the first decision stands) before any of its processes is stopped."""
    if not job.status.get("ending"):
        job.set_state("TERMINATING", message, ending={"state": state, "message": message, "at": time.time()})


def skip_reason(job: Job, started: float, longest) -> str | None:
    """Why the next variant must not start inside limits.max_downtime (None: it may)."""
    budget = job.spec["limits"].get("max_downtime")
    if budget is None:
        return None
    left = budget - (time.time() - started)
    if longest is None:
        return None if left > 0 else "the window is used up: limits.max_downtime (%g s) ended before it could " \
                                     "start" % budget
    if longest <= left:
        return None
    return "needs about %.1f s (the longest variant so far), only %.1f s of limits.max_downtime (%g s) left" % (
        longest, max(left, 0), budget)


class Run:
    """A variant in a slot: its process, deadline and stop (TERM → grace → KILL one step per poll, so a slow
    stop holds only its own slot)."""

    def __init__(self, index: int, variant: dict, slot: int, devices: list, proc, start_time, seconds: float,
                 bound: str, result: str):
        self.index, self.variant, self.slot, self.devices, self.proc = index, variant, slot, devices, proc
        self.start_time = start_time  # the process's, its identity for a restorer
        self.seconds, self.bound, self.result = seconds, bound, result
        self.began = time.monotonic()
        self.deadline = self.began + seconds
        self.ended: float | None = None  # when it exited or was told to stop
        self.reason: str | None = None  # why it was stopped: its bound, a cancel or a signal
        self.term_at: float | None = None
        self.kill_at: float | None = None
        self.exit_fd = exit_fd(proc.pid)


def exit_fd(pid: int):
    """A pidfd, readable once the process exits (None where there is none: the poll's clock sees it)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def wait_for_an_exit(running: dict, seconds: float) -> None:
    """Up to `seconds`, less when a running variant's process exits first."""
    fds = [run.exit_fd for run in running.values() if run.ended is None and run.exit_fd is not None]
    if fds:
        select.select(fds, [], [], seconds)
    else:
        time.sleep(seconds)


def start_variant(job: Job, index: int, of: int, variant: dict, slot: int, devices: list, window: tuple,
                  staged=None) -> Run:
    """The variant launched on its slot (staged: handed the GPU), bounded by max_runtime and the window."""
    limits = job.spec["limits"]
    result = result_path(job, index)
    seconds, bound = limits["max_runtime"], "limits.max_runtime (%gs)" % limits["max_runtime"]
    if limits.get("max_downtime") is not None:  # never past the window's end
        left = max(0.0, limits["max_downtime"] - (time.time() - window[0]))
        if left < seconds:
            seconds, bound = left, "limits.max_downtime (%gs)" % limits["max_downtime"] + (
                ", the service's window" if window[1] else "")
    announce(job, index, of, variant, "start", slot=slot, devices=devices)
    if staged is not None:
        proc = stage.hand_over(job, staged)
    else:
        argv = payload_argv(job.spec, variant["argv"])
        if plain(job):
            proc = launch_payload(job, argv, result=result)
        else:
            proc = launch_payload(job, argv, phase="variant %d of %d: %s" % (index, of, label(variant["args"])),
                                  result=result, slot=(slot, devices))
    start_time = job.status["payload"]["start_time"]  # launch_payload recorded this process last
    return Run(index, variant, slot, devices, proc, start_time, seconds, bound, result)


def wait_for_ends(job: Job, flags: Flags, running: dict, more: bool = False) -> tuple:
    """([runs whose processes are gone], a cancel's or a signal's (state, message) or None): stops the runs
    that ended or reached their bound, all of them on a cancel or a signal. more: variants are still to start
    (then a cancel ends the job even while only exited runs' groups are being stopped)."""
    interrupt = None
    while True:
        now = time.monotonic()
        live = more or any(run.ended is None and run.proc.poll() is None for run in running.values())
        if interrupt is None and live:  # it stops a run still going or what is still to start; one that exited
            interrupt = interrupt_of(job, flags)  # 0 is only having its group cleaned up, no cancel's success
        for run in running.values():
            if run.ended is None and (interrupt or run.proc.poll() is not None or now >= run.deadline):
                if interrupt is None and run.proc.returncode:  # a cancel's signal can reach the payload first
                    interrupt = interrupt_after_exit(job, flags, run.proc.returncode)
                run.ended = now
                if interrupt:
                    run.reason = interrupt[1]
                elif run.proc.returncode is None:
                    run.reason = "the payload ran past %s" % run.bound
                    if plain(job):  # its bound is the job's end
                        decide_ending(job, "TIMED_OUT", run.reason)
        if interrupt:
            decide_ending(job, *interrupt)
            for run in running.values():
                if run.ended is None:
                    run.ended, run.reason = now, interrupt[1]
        gone = [run for run in running.values() if run.ended is not None and stop_step(job, run, now)]
        if gone:
            return gone, interrupt
        wait_for_an_exit(running, POLL_S)  # the clock still serves the bounds, the stops and a cancel


def stop_step(job: Job, run: Run, now: float) -> bool:
    """The next step of a run's stop; True once its group is gone (or, SIGKILLed, KILL_CONFIRM_S passed)."""
    pgid = run.proc.pid
    run.proc.poll()  # reap our own child so it does not linger as a zombie
    if run.term_at is None:
        run.term_at = now
        if not signal_group(pgid, signal.SIGTERM):
            return True
    if not group_alive(pgid):
        return True
    if run.kill_at is None:
        if now >= run.term_at + job.spec["limits"]["grace"]:
            run.kill_at = now
            return not signal_group(pgid, signal.SIGKILL)
        return False
    return now >= run.kill_at + KILL_CONFIRM_S


def signal_group(pgid: int, sig) -> bool:
    """False when the group is gone already."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def end_variant(job: Job, of: int, run: Run) -> dict:
    """A stopped run's exit recorded and announced; its record."""
    returncode = run.proc.poll()
    if run.exit_fd is not None:
        os.close(run.exit_fd)
    where = {} if plain(job) else {"variant": run.index}
    if returncode is None:  # SIGKILLed and still there (stuck in the driver): abandoned, not awaited
        job.event("payload-exit", abandoned=True, pid=run.proc.pid, **where)
        code = None
    else:
        code = record_exit(job, returncode, pid=run.proc.pid, **where)
    assert run.ended is not None  # wait_for_ends hands over only runs that ended
    seconds = round(run.ended - run.began, 3)  # to its end, not to the end of its stop
    if plain(job):  # its result.json is the payload's own: not read here
        return {"index": run.index, "args": {}, "status": "ended", "exit_code": code, "seconds": seconds,
                "reason": run.reason}
    record = variant_record(run.index, run.variant["args"], "ended", code, seconds, run.reason, run.result,
                            slot=run.slot, devices=run.devices)
    announce(job, run.index, of, run.variant, "end", exit_code=code, seconds=seconds, slot=run.slot,
             devices=run.devices, **({"error": record["error"]} if record["error"] else {}))
    return record


def variant_record(index: int, args: dict, status: str, code, seconds, reason, result: str, **where) -> dict:
    """One variant in result.json (`status`: ended or skipped; also a Slurm array task's, slurm/array.py), its
    RUNNER_RESULT read back: an unusable one is this variant's failure (`error`), never the sweep's; one over
    INLINE_RESULT_BYTES stays in its file (`result_file`). where: the slot and devices it ran on."""
    outcome, error, kept = read_variant_result(result)
    tables = [t for t in (outcome or {}).values() if isinstance(t, list) and t and isinstance(t[0], dict)]
    return {"index": index, "args": args, "status": status, "exit_code": code, "seconds": seconds,
            "reason": reason or error, "error": error, "result": outcome, "result_file": kept,
            "columns": list(tables[0][0]) if tables else None, **where}  # columns: the payload's order


def result_name(path: str) -> str:
    """A variant's result file as the combined record names it, relative to the job dir."""
    return os.path.join("results", os.path.basename(path))


def read_variant_result(path: str) -> tuple:
    """(the result object, why it is unusable, its `result_file` listing when too large), each or None."""
    name, job_dir = result_name(path), os.path.dirname(os.path.dirname(path))
    try:
        fd, info = open_result(path, job_dir)
    except FileNotFoundError:
        return None, None, None
    except (OSError, UnsafeResult) as exc:
        return None, "its result %s %s" % (name, exc), None
    try:
        if info.st_size > INLINE_RESULT_BYTES:
            return None, None, kept_file(name, fd, info.st_size, "over the %d MB a variant's result may take in "
                                         "result.json" % (INLINE_RESULT_BYTES >> 20))
        with os.fdopen(fd, "rb", closefd=False) as fh:
            outcome = parse_bounded(fh.read(INLINE_RESULT_BYTES + 1))
    except UnsafeResult as exc:
        return None, "its result %s %s" % (name, exc), None
    except (OSError, ValueError) as exc:
        return None, "its result %s is not JSON: %s" % (name, str(exc)[:200]), None
    finally:
        os.close(fd)
    if not isinstance(outcome, dict):
        kind = {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
            type(outcome), "null")
        return None, "its result %s is %s, not a JSON object (e.g. {\"rows\": [...]})" % (name, kind), None
    return outcome, None, None


def kept_file(name: str, fd: int, size: int, why: str) -> dict:
    """A variant's result listed instead of inlined: it stays on the host in its own file."""
    return {"name": name, "bytes": size, "sha256": file_digest(fd, size, DIGEST_MAX_BYTES), "why": why}


def listing(job_dir: str, index: int, why: str) -> dict:
    """Variant `index`'s result file listed (an unreadable one, changed since it was read, without size)."""
    path = os.path.join(job_dir, "results", "variant-%d.json" % index)
    try:
        fd, info = open_result(path, job_dir)
    except (OSError, UnsafeResult):
        return {"name": result_name(path), "bytes": None, "sha256": None, "why": why}
    try:
        return kept_file(result_name(path), fd, info.st_size, why)
    finally:
        os.close(fd)


def fit_combined(job_dir: str, records: list) -> list:
    """The largest inlined results set aside (`result_file`) until the records fit COMBINED_RESULT_BYTES."""
    sizes = {r["index"]: len(json.dumps(r["result"])) for r in records if r.get("result") is not None}
    total = len(json.dumps(records))
    for index in sorted(sizes, key=lambda i: sizes[i], reverse=True):
        if total <= COMBINED_RESULT_BYTES:
            break
        record = next(r for r in records if r["index"] == index)
        why = "set aside so that result.json stays under %d MB" % (COMBINED_RESULT_BYTES >> 20)
        record.update(result=None, columns=None, result_file=listing(job_dir, index, why))
        total -= sizes[index]
    return records


def run_variants(job: Job, flags: Flags, staged=None) -> None:
    """Every variant, each slot taking the next as its own ends, then finish (staged: the first's process)."""
    variants = job_variants(job.spec)
    n = len(variants)
    slots = (job.spec.get("sweep") or {}).get("slots") or [job.spec["gpu"]["devices"]]
    window = window_start(job)
    if not plain(job):
        os.makedirs(os.path.join(job.paths.dir, "results"), exist_ok=True)
    records: dict[int, dict] = {}  # variant index -> its record
    running: dict[int, Run] = {}  # slot -> the variant running on it
    pending = list(enumerate(variants, 1))
    longest, halt, interrupted = None, None, None
    while pending or running:
        if interrupted is None and pending:
            interrupted = interrupt_of(job, flags)  # seen before a variant starts: none does
            if interrupted:
                decide_ending(job, *interrupted)
                halt = "not started: " + interrupted[1]
        for slot in [k for k in range(len(slots)) if k not in running]:
            while pending and slot not in running:
                index, variant = pending.pop(0)
                reason = halt or skip_reason(job, window[0], longest)
                if reason:
                    announce(job, index, n, variant, "skipped", reason=reason)
                    records[index] = {"index": index, "args": variant["args"], "status": "skipped", "exit_code": None,
                                      "seconds": None, "reason": reason, "result": None, "result_file": None}
                else:  # noted at once: status.json's payload names only the process launched last
                    running[slot] = start_variant(job, index, n, variant, slot, slots[slot], window,
                                                  staged if index == 1 else None)
                    note_slots(job, slots, running)
        if not running:
            continue
        gone, interrupt = wait_for_ends(job, flags, running, more=bool(pending) and halt is None)
        if interrupt is not None and interrupted is None:  # a cancel or a signal ends the job
            interrupted, halt = interrupt, "not started: " + interrupt[1]
        for run in gone:
            record = records[run.index] = end_variant(job, n, running.pop(run.slot))
            longest = max(longest or 0.0, record["seconds"])
            if record["exit_code"] != 0 and (job.spec.get("sweep") or {}).get("fail_fast") and halt is None:
                halt = "not started: variant %d failed and sweep.fail_fast is set" % record["index"]
        note_slots(job, slots, running)
    finish(job, [records[k] for k in sorted(records)], slots)


def note_slots(job: Job, slots: list, running: dict) -> None:
    """status.json's `slots` and the ledger's: each slot's devices and variant now, its process for a restorer
    (with one slot, `payload` names it)."""
    if len(slots) < 2:
        return
    table = []
    for k, devices in enumerate(slots):
        run = running.get(k)
        entry = {"slot": k, "devices": devices, "variant": run.index if run else None}
        if run:
            entry.update(pid=run.proc.pid, pgid=run.proc.pid, start_time=run.start_time)
        table.append(entry)
    job.save(durable=False, slots=table)  # whole at once for a restorer; the launch's was the durable write
    note_in_ledger(job, slots=[ledger.ident(s) for s in table if s["variant"]])


def finish(job: Job, records: list, slots: list) -> None:
    """The job's end: its decided `ending`, else a plain job's exit code or a sweep's combined record."""
    ending = job.status.get("ending")
    if plain(job):
        if ending:
            raise Interrupted(ending["state"], ending["message"])
        if records[0]["status"] == "skipped":
            raise Interrupted("TIMED_OUT", "the payload did not start: " + records[0]["reason"])
        return
    n = len(records)
    ok = sum(1 for r in records if r["status"] == "ended" and r["exit_code"] == 0 and not r.get("error"))
    skipped = sum(1 for r in records if r["status"] == "skipped")
    summary: dict = {"variants": n, "succeeded": ok, "failed": n - ok - skipped, "skipped": skipped}
    if job.spec["sweep"].get("gpus_per_variant") is not None:  # side by side: the slots they ran on
        summary["slots"] = slots
    combined = {"payload": "sweep", "sweep": summary, "variants": fit_combined(job.paths.dir, records)}
    job.persist(lambda: write_json_atomic(job.paths.result, combined))
    job.save(sweep=summary, exit_code=0 if ok == n else 1)
    if ending:
        raise Interrupted(ending["state"], ending["message"])
    if ok != n:
        raise Interrupted("FAILED", "sweep: %d succeeded, %d failed, %d skipped of %d variants"
                          % (ok, summary["failed"], skipped, n))
