"""A sweep on the host: every variant in turn inside the one window that supervise() opened (one stop, one
drain before, one restore after, by settle).

Each variant is its own process (its own exit code; its RUNNER_RESULT is results/variant-K.json), announced
by a `variant` event (start, end or skipped) in events.jsonl and echoed as the same JSON line in output.log,
so `runner tail` shows the boundaries and progress.py counts "variant k of n". A failing variant does not stop
the others unless sweep.fail_fast. With limits.max_downtime no variant starts that could not end inside the
window (bound: the longest variant measured so far, else limits.max_runtime): it is recorded SKIPPED with
the reason, and a running one is stopped at the window's end. result.json is the combined record.

Imports only the stdlib, contract.py and the supervisor rooms.
"""
from __future__ import annotations

import os
import subprocess
import time

try:  # imported as remote_payload.supervisor_sweep (tests)
    from .supervisor_files import append_line, read_json, write_json_atomic
    from .supervisor_host import KILL_CONFIRM_S, group_members, kill_group
    from .supervisor_payload import launch_payload, record_exit, watch_payload
    from .supervisor_record import Interrupted, Job
    from .sweep import label
except ImportError:  # run from supervisor.py as a script: sys.path[0] is this directory
    from supervisor_files import append_line, read_json, write_json_atomic
    from supervisor_host import KILL_CONFIRM_S, group_members, kill_group
    from supervisor_payload import launch_payload, record_exit, watch_payload
    from supervisor_record import Interrupted, Job
    from sweep import label


def announce(job: Job, index: int, of: int, variant: dict, status: str, **extra) -> None:
    """The boundary: an event in events.jsonl and the same line in the log."""
    fields = dict(index=index, of=of, args=variant["args"], status=status, **extra)
    job.event("variant", **fields)
    job.persist(lambda: append_line(job.paths.output, dict(fields, event="variant")))


def skip_reason(job: Job, started: float, longest) -> str | None:
    """Why the next variant must not start inside limits.max_downtime (None: it may)."""
    budget = job.spec["limits"].get("max_downtime")
    if budget is None:
        return None
    needs = longest if longest is not None else job.spec["limits"]["max_runtime"]
    left = budget - (time.time() - started)
    if needs <= left:
        return None
    basis = "the longest variant so far" if longest is not None else "limits.max_runtime"
    return "needs about %.1f s (%s), only %.1f s of limits.max_downtime (%g s) left" % (needs, basis, max(left, 0), budget)


def run_variant(job: Job, flags, index: int, of: int, variant: dict, started: float) -> tuple:
    """(record, stop): the variant run to its end, or stopped by its bound, a cancel or a signal."""
    payload, limits = job.spec["payload"], job.spec["limits"]
    result = os.path.join(job.paths.dir, "results", "variant-%d.json" % index)
    announce(job, index, of, variant, "start")
    began = time.monotonic()
    argv = list(variant["argv"]) if payload["command"] is not None else \
        [payload["python"], payload["path"]] + variant["argv"]
    proc = launch_payload(job, argv, phase="variant %d of %d: %s" % (index, of, label(variant["args"])), result=result)
    bound = None
    if limits.get("max_downtime") is not None:  # never past the window's end
        bound = max(0.0, min(limits["max_runtime"], limits["max_downtime"] - (time.time() - started)))
    stop = watch_payload(job, proc, flags, seconds=bound)
    job.payload_pids.update(group_members(proc.pid))
    kill_group(proc.pid, limits["grace"], proc)
    try:
        record_exit(job, proc.wait(timeout=KILL_CONFIRM_S))
        code = job.status["exit_code"]
    except subprocess.TimeoutExpired:  # SIGKILLed and still there: abandoned, as run_payload does
        job.event("payload-exit", abandoned=True, pid=proc.pid)
        code = None
    seconds = round(time.monotonic() - began, 3)
    record = variant_record(index, variant["args"], "ended", code, seconds, stop[1] if stop else None, result)
    announce(job, index, of, variant, "end", exit_code=code, seconds=seconds,
             **({"error": record["error"]} if record["error"] else {}))
    return record, stop


def variant_record(index: int, args: dict, status: str, code, seconds, reason, result: str) -> dict:
    """One variant in result.json (`status`: ended or skipped), its RUNNER_RESULT file read back; also what
    a Slurm job array's login node writes for each of its tasks (slurm_array.py). A result file that is not a
    JSON object is this variant's failure (`error`, also its `reason`), never the sweep's."""
    outcome, error = read_variant_result(result)
    tables = [t for t in (outcome or {}).values() if isinstance(t, list) and t and isinstance(t[0], dict)]
    return {"index": index, "args": args, "status": status, "exit_code": code, "seconds": seconds,
            "reason": reason or error, "error": error, "result": outcome,
            "columns": list(tables[0][0]) if tables else None}  # the payload's column order


def read_variant_result(path: str) -> tuple:
    """(the result object or None, why it is unusable or None); a missing file is no result, not an error."""
    name = os.path.join("results", os.path.basename(path))
    try:
        outcome = read_json(path)
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, "its result %s is not JSON: %s" % (name, str(exc)[:200])
    if not isinstance(outcome, dict):
        kind = {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
            type(outcome), "null")
        return None, "its result %s is %s, not a JSON object (e.g. {\"rows\": [...]})" % (name, kind)
    return outcome, None


def run_sweep(job: Job, flags) -> None:
    """Every variant in turn; result.json is the combined record; FAILED unless each ran and exited 0."""
    sweep = job.spec["sweep"]
    variants, n = sweep["variants"], len(sweep["variants"])
    started = job.status["service"].get("stopped_at") or time.time()  # the window: from the stop, if any
    os.makedirs(os.path.join(job.paths.dir, "results"), exist_ok=True)
    records, longest, halt, interrupted = [], None, None, None
    for index, variant in enumerate(variants, 1):
        reason = halt or skip_reason(job, started, longest)
        if reason:
            announce(job, index, n, variant, "skipped", reason=reason)
            records.append({"index": index, "args": variant["args"], "status": "skipped", "exit_code": None,
                            "seconds": None, "reason": reason, "result": None})
            continue
        record, stop = run_variant(job, flags, index, n, variant, started)
        records.append(record)
        longest = max(longest or 0.0, record["seconds"])
        if stop is not None and stop[0] != "TIMED_OUT":  # a cancel or a signal ends the sweep
            interrupted, halt = stop, "not started: " + stop[1]
        elif record["exit_code"] != 0 and sweep["fail_fast"]:
            halt = "not started: variant %d failed and sweep.fail_fast is set" % index
    ok = sum(1 for r in records if r["status"] == "ended" and r["exit_code"] == 0 and not r.get("error"))
    skipped = sum(1 for r in records if r["status"] == "skipped")
    summary = {"variants": n, "succeeded": ok, "failed": n - ok - skipped, "skipped": skipped}
    job.persist(lambda: write_json_atomic(job.paths.result, {"payload": "sweep", "sweep": summary,
                                                             "variants": records}))
    job.save(sweep=summary, exit_code=0 if ok == n else 1)
    if interrupted is not None:
        raise Interrupted(*interrupted)
    if ok != n:
        raise Interrupted("FAILED", "sweep: %d succeeded, %d failed, %d skipped of %d variants"
                          % (ok, summary["failed"], skipped, n))
