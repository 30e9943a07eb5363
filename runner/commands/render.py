"""The text a person reads of a job, the same for every front end: a job's status block, a fleet host's line,
a service's window and what became of its clients, the steps `submit --dry-run` lists. Pure: typed answers in,
text out; the parts status.json leaves open (the payload may have rewritten them) are checked value by value,
and the host's text is made printable.
"""
from __future__ import annotations

import shlex
import time
from typing import Any

from remote_payload.contract import is_terminal
from remote_payload.sweep import label as variant_label

from ..printable import printable
from ..remote.job_answers import JobStatus, Progress, ServiceRecord

WINDOW_PARTS = ("release", "drain", "payload", "resume", "health")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{seconds:.1f} s" if seconds < 120 else f"{int(seconds // 60)} min {int(seconds % 60)} s"


def exit_note(code: int | None) -> str:
    """The payload's exit code when it has one (a job cancelled before its payload started has none)."""
    return "" if code is None else f" (payload exit code {code})"


# -- a job ------------------------------------------------------------------------------------------------

def job_text(job: JobStatus) -> str:
    """`runner status JOB`: a head line, then one line each for what the job has (elapsed, payload, sweep,
    slots, scheduler, services, exit code, why)."""
    if job.error:  # its host was not asked: unreachable, a refused key or login
        return f"{job.job_id}: last known {job.state} ({job.message})"
    lines = [f"{job.job_id}: {job.state}" + (f" ({job.phase})" if job.phase else "")]
    now = job.now or time.time()
    started = job.started_at or job.created_at
    if started:
        lines.append(f"  elapsed     {duration((job.ended_at or now) - started)}")
    if job.progress:
        lines += _progress_lines(job.progress)
    if job.slots and len(job.slots) > 1 and not is_terminal(job.state):  # side by side
        lines.append("  slots       " + " · ".join(_slot_text(slot) for slot in job.slots if isinstance(slot, dict)))
    lines += _scheduler_lines(job)
    several = [s for s in job.services if s.unit]
    for one in several or ([job.service] if job.service.unit else []):
        freed = (" (freed)" if one.stopped else " (not freed)") if several else ""
        lines.append(f"  service     {one.unit} {service_states(one)}{freed}" + _stop_result(one)
                     + downtime_text(one, now))
    if job.services_kept:
        lines.append(f"  kept        {', '.join(job.services_kept)} serving (not on the job's GPUs: never touched)")
    if job.exit_code is not None:
        lines.append(f"  payload exit code {job.exit_code}")
    if job.message:
        lines.append(f"  why         {job.message}")
    return "\n".join(lines)


def job_line(job: JobStatus) -> str:
    """A fleet host's job in one line: `ID  STATE (phase)  service was … now …, downtime 12.3 s  exit code 0`."""
    text = f"{job.job_id}  {job.state}" + (f" ({job.phase})" if job.phase else "")
    if job.service.unit:
        text += f"  service {service_states(job.service)}" + downtime_text(job.service, job.now or time.time(),
                                                                          brief=True)
    if job.exit_code is not None:
        text += f"  exit code {job.exit_code}"
    return text


def _progress_lines(progress: Progress) -> list[str]:
    sweep = progress.sweep
    rows = progress.rows_done
    rows_text = f"{rows} of {progress.rows_expected}" if progress.rows_expected else str(rows)
    side_by_side = sweep.get("side_by_side") is True
    whose = " (the sweep's: its variants run side by side)" if side_by_side else ""
    lines = [f"  payload     phase {_phase_text(progress)}, rows {rows_text}{whose}, "
             f"last output {progress.silent_s or 0:.0f} s ago"]
    variant = progress.variant
    if side_by_side:
        lines.append(f"  sweep       {_sweep_text(sweep)}")
    elif variant:
        lines.append(f"  sweep       variant {variant['index']} of {variant['of']}: {variant_label(variant['args'] or {})}"
                     + (" (skipped)" if variant.get("status") == "skipped" else "")
                     + (f"; the sweep: {_sweep_text(sweep)}" if sweep else ""))
    return lines


def _scheduler_lines(job: JobStatus) -> list[str]:
    slurm, array = job.slurm, job.array
    if array:  # a sweep on Slurm: one job array
        reasons = ", ".join(array.get("reasons") or {})
        return [f"  array       slurm {slurm.job_id}: {array['done']} of {array['of']} done "
                f"({array['succeeded']} succeeded, {array['failed']} failed, {array['skipped']} skipped), "
                f"{array['running']} running, {array['pending']} pending" + (f" ({reasons})" if reasons else "")]
    if slurm.job_id:
        return [f"  scheduler   slurm {slurm.job_id} {slurm.state or '?'}"
                + (f" ({slurm.reason})" if slurm.reason else "") + (f" on {slurm.node}" if slurm.node else "")]
    return []


def _sweep_text(sweep: dict) -> str:
    """`1 of 4 variants done, running 2, 3, rows 11 of 32 in all`: the host's tally of a sweep (progress.py)."""
    def count(key: str) -> int | str:  # the host's numbers: anything else is shown as unknown
        return sweep[key] if isinstance(sweep.get(key), int) else "?"

    running = [k for k in sweep["running"] if isinstance(k, int)] if isinstance(sweep.get("running"), list) else []
    expected = f" of {sweep['rows_expected']}" if isinstance(sweep.get("rows_expected"), int) else ""
    return (f"{count('done')} of {count('of')} variants done"
            + (f", running {', '.join(map(str, running))}" if running else "")
            + f", rows {count('rows')}{expected} in all")


def _slot_text(slot: dict) -> str:
    """`GPU 0,1: variant 3` (or `idle`): one slot of a sweep's side-by-side variants, from status.json."""
    devices = slot.get("devices")
    gpus = ",".join(map(str, devices)) if isinstance(devices, list) else "?"
    return f"GPU {gpus}: " + (f"variant {slot['variant']}" if slot.get("variant") else "idle")


def _phase_text(progress: Progress) -> str:
    """The payload's phase as of its last event: one that ended (rows may already be coming) says so."""
    if not progress.phase:
        return "-"
    return progress.phase + {"end": " ended", "error": " failed"}.get(progress.phase_status, "")


# -- a service --------------------------------------------------------------------------------------------

def service_states(service: ServiceRecord) -> str:
    """`was active now inactive`; a job still queued has looked at nothing yet (the host fills both in)."""
    if service.was is None and service.now is None:
        return "not touched yet"
    return f"was {service.was or '?'} now {service.now or '?'}"


def _stop_result(service: ServiceRecord) -> str:
    """A unit our stop left failed (its engine's own shutdown under the SIGTERM) is said to be that, not a fault."""
    if service.stop_result is None or service.now != "failed":
        return ""
    result = printable(str(service.stop_result.get("result")), multiline=False)[:40]  # the host's text
    return f" (left failed by this job's stop, Result={result}; reset and started at the restore)"


def downtime_text(service: ServiceRecord, now: float, *, brief: bool = False) -> str:
    """`, downtime 26.2 s (stop: release 0.5, … s); clients …` once the service is back, `, down for 3.1 s so
    far` while it is not; `brief` (a fleet's one line): the total alone, the time so far in seconds."""
    if service.downtime_s is not None:
        return f", downtime {service.downtime_s:.1f} s" + ("" if brief else _downtime_parts(service.window))
    if service.stopped_at and not service.restored_at:
        down = now - service.stopped_at
        return f", down for {f'{down:.1f} s' if brief else duration(down)} so far"
    return ""


def _downtime_parts(parts: dict | None) -> str:
    """" (stop: release 0.8, drain 0.0, payload 22.2, resume 3.5, health 5.8 s)": the window's parts."""
    known = window_parts(parts or {})
    return (f" ({(parts or {})['method']}: {known} s)" if known else "") + clients_text(parts or {})


def window_parts(window: dict) -> str:
    """"release 0.8, drain 0.0, payload 22.2, resume 3.5, health 5.8": the parts that are numbers."""
    return ", ".join(f"{name} {window[name + '_s']:.1f}" for name in WINDOW_PARTS if _number(window.get(name + "_s")))


def clients_text(window: dict) -> str:
    """"; clients (retract): 4 in flight at the pause: 4 held, 0 aborted, 0 truncated, 0 refused; held 9.9 s": what
    the engine said became of the requests in flight when the window began (its load just before the pause) and
    how long clients were held (from the pause to the engine taking requests again)."""
    clients = window.get("clients")
    if not isinstance(clients, dict):
        return ""

    def count(key: str) -> str:
        value = clients.get(key)
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else "?"
    fates = ", ".join(f"{count(key)} {key}" for key in ("held", "completed", "aborted", "truncated", "refused")
                      if key in clients)
    after = ""
    if _number(clients.get("drained_s")):
        after = f" (drained in {clients['drained_s']:.1f} s while serving"
        after += f", {count('gate_pauses')} gate pause(s))" if "gate_pauses" in clients else ")"
    if _number(clients.get("drain_timed_out_s")):
        after = f" (not idle after a {clients['drain_timed_out_s']:.1f} s drain: drain_fallback abort)"
    if _number(clients.get("hold_s")):
        after += f"; held {clients['hold_s']:.1f} s"
    mode = window.get("pause_mode") or window.get("method")
    return (f"; clients{f' ({printable(mode)})' if isinstance(mode, str) else ''}: {count('at_pause')} in flight "
            f"at the pause: {fates}{after}")


def window_lines(window: dict) -> list[str]:
    """`results`' lines on the services: one window, or one per freed service (`services`), each unit named."""
    several = [w for w in window.get("services") or [] if isinstance(w, dict)]
    return [window_text(w, w.get("unit")) for w in several] if several else [window_text(window)]


def window_text(window: dict, unit: str | None = None) -> str:
    """One window: "service window (stop): not serving 26.2 s (release 0.5, … s)", "service window of U (stop)…"."""
    total = window.get("not_serving_s")
    shown = f"{total:.1f} s" if _number(total) else "?"
    parts = window_parts(window)
    return (f"service window{f' of {unit}' if unit else ''} ({window.get('method')}): not serving {shown}"
            + (f" ({parts} s)" if parts else "") + clients_text(window))


FREED_BY = {"stop": "stopped; started again after",
            "sglang": "pause generation and release its GPU memory; resume after (the unit keeps running)",
            "vllm": "sleep level 1; wake after (the unit keeps running)"}


def dry_run_steps(wire: dict, argv: list[str], stop: bool) -> dict:
    """What the job runs before the service is touched, what runs in the window, and how each service is
    freed (docs/design.md, "The downtime window")."""
    payload, limits = wire["payload"], wire["limits"]
    before = []
    if payload.get("prepare") is not None:
        prepare = payload["prepare"] if payload["command"] else [payload["python"], payload["script"], *payload["prepare"]]
        before.append(f"prepare: {shlex.join(prepare)} (limits.prepare_timeout {limits['prepare_timeout']:g} s; "
                      "if it fails nothing is stopped)")
    if payload.get("staged"):
        before.append(f"staged: {shlex.join(argv)} starts and does its GPU-free setup while the service serves "
                      f"(limits.stage_timeout {limits['stage_timeout']:g} s), then waits for the GPU")
    variants = (wire.get("sweep") or {}).get("variants")
    bound = f"limits.max_runtime {limits['max_runtime']:g} s"
    window = [f"sweep: {len(variants)} variants of {shlex.join(argv)} ({bound} each)"] if variants else \
        [f"payload: {shlex.join(argv)} (" + ("gets the GPU with `go`; " if payload.get("staged") else "") + f"{bound})"]
    services = [s for s in wire.get("services") or [wire.get("service") or {}] if s.get("unit")]
    freed = [f"{s['unit']}: free: {s.get('free', 'stop')} — {FREED_BY[s.get('free', 'stop')]}" if stop
             else f"{s['unit']}: left serving (not freed)" for s in services]
    return {"before_stop": before, "window": window,
            "freed": freed or ["nothing: no service to free (service.manager none)"]}
