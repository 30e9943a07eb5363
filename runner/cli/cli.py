"""The `runner` command line. The only module that prints errors or exits: `main` for errors (each carries
its code, errors.py), `exit_code` for what a command found (a job's or a service's state).

Human output goes to stdout, progress and messages to stderr; `--json` prints one JSON document.
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict

import click

from remote_payload.contract import is_terminal
from remote_payload.sweep import label as variant_label

from ..deadline import DEFAULT_MAX_WAIT_S, ROUND_TRIP_ALLOWANCE_S, Deadline
from ..errors import (CODE_ABORTED, CODE_USAGE, EXIT_ABORTED, EXIT_FAILED, EXIT_OK, EXIT_USAGE, RunnerError,
                      SpecError, exit_code)
from ..printable import printable
from ..state.store import Store
from .cli_echo import emit_json as _emit_json, progress as _progress, say as _say

# Each command imports what it runs (the controller, fleets, the host protocol) when it runs: `runner list`
# reads the local index and needs none of them.

DEFAULT_MAX_WAIT = DEFAULT_MAX_WAIT_S
WATCH_UNTIL_END = 86400.0  # `runner watch` on a terminal: until the job ends (a day at most)

EXIT_CODES_HELP = """\b
Exit codes (every command; `--json` errors are JSON objects {error, message, hint, exit}):
  0   done / accepted / healthy / SUCCEEDED
  1   the job ended other than SUCCEEDED, no result, or the service failed to come back
  2   bad job spec or usage, unknown job id (the message names the file and field), the local
      state dir cannot be written
  3   host unreachable, authentication failed, host key unknown or changed, the host answered
      outside the wire contract; tail: the host's log is shorter than the cursor
  4   preflight refused (GPU memory short and the policy forbids stopping, GPU missing,
      need > total, a start condition such as a missing interpreter, an engine that cannot
      free its memory); nothing was touched
  5   host busy: another job holds the lock (the message names it)
  75  still running / still starting: call again
"""
JOB_EXITS = "Exit: 0 SUCCEEDED · 1 ended otherwise · 75 still running · 2 · 3 (see `runner --help`)."


@click.group(help="Detached remote benchmark jobs over SSH that stop a GPU service, run, and bring it back.\n\n"
                  + EXIT_CODES_HELP)
@click.version_option(package_name="runner")
def cli() -> None:
    pass


@cli.command(help="Validate JOB.yaml, check the payload's args, preflight the host, start the job detached; "
                  "print its id. Exit: 0 accepted · 2 bad spec · 3 · 4 refused · 5 busy (75 with --follow: "
                  "still running).")
@click.argument("job_file")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a spec field, e.g. payload.args.experts=128.")
@click.option("--queue", is_flag=True, help="If the service/GPU lock is held, wait on the host until it is free "
              "instead of refusing with exit 5; at most limits.queue_timeout (default 2h), then the job ends "
              "TIMED_OUT with nothing stopped.")
@click.option("--queue-timeout", default=None, metavar="DURATION",
              help="--queue, waiting at most this long (e.g. 30m; same as --set limits.queue_timeout=...).")
@click.option("--job-id", default=None, help="Choose the job id (makes a retried submit safe).")
@click.option("--dry-run", is_flag=True, help="Validate and preflight, print the decision (stop the service? "
              "memory needed and free, the command), change nothing.")
@click.option("--follow", is_flag=True, help="After submitting, print the log like `tail -f` for up to --max-wait.")
@click.option("--max-wait", type=click.FloatRange(0, 3600), default=DEFAULT_MAX_WAIT, show_default=True,
              help="Seconds this call may take, plus one round trip (a link that goes silent: exit 3; submit "
                   "again with the same --job-id). With --follow: the log is followed until then, then 75. A "
                   "fleet (a list of hosts): seconds to drive the rollout before returning 75 (`runner wait RUN` "
                   "goes on).")
@click.option("--forks", type=click.IntRange(1, 256), default=None, metavar="N",
              help="A fleet: at most N host calls at once (default: the spec's rollout.forks, 16).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def submit(job_file, overrides, queue, queue_timeout, job_id, dry_run, follow, max_wait, forks, as_json) -> None:
    from ..commands import controller

    if queue_timeout is not None:
        overrides, queue = (*overrides, "limits.queue_timeout=" + queue_timeout), True
    deadline, store = Deadline.for_command(max_wait), Store()
    # An edited spec's host call opens while the spec is validated; nothing is sent before the checks pass.
    with controller.early_submit(job_file, overrides, store=store, job_id=job_id, queue=queue, deadline=deadline,
                                 wanted=not dry_run) as early:
        plan = controller.local_plan(job_file, overrides)  # the command's one validation (or the cached plan)
        one_job = not (plan.is_fleet or dry_run or forks is not None)
        done = controller.submit(job_file, list(overrides), queue=queue, job_id=job_id, store=store,
                                 progress=_progress, planned=plan, deadline=deadline, early=early) if one_job else None
    if plan.is_fleet:
        from . import fleet_cli

        sys.exit(fleet_cli.submit(plan, run_id=job_id, queue=queue, dry_run=dry_run, max_wait=max_wait,
                                  as_json=as_json, forks=forks))
    if forks is not None:
        raise SpecError("--forks goes with a fleet (a list of hosts in host.address); this spec names one host")
    if dry_run:
        decided = controller.dry_run(job_file, list(overrides), queue=queue, job_id=job_id, planned=plan,
                                     deadline=deadline)
        _emit_json(asdict(decided)) if as_json else _say(_dry_run_text(decided))
        return
    if as_json and not follow:
        _emit_json(asdict(done))
        return
    _progress(f"{'already submitted' if done.already else 'accepted'}: {done.state} on {done.host}"
              + ("" if follow else f"; follow with `runner tail {done.job_id} -f`"))
    _say(done.job_id)
    if follow:
        sys.stdout.flush()
        # What is left of this call's --max-wait: the submit and the log share it.
        _tail_and_exit(done.job_id, follow=True, max_wait=max(0.0, deadline.left() - ROUND_TRIP_ALLOWANCE_S),
                       from_start=False, as_json=as_json)


def _dry_run_text(plan) -> str:
    service = plan.service or {}
    lines = [f"dry run on {plan.host}: nothing was started or changed",
             f"  job id        {plan.job_id}",
             f"  command       {' '.join(plan.argv)}",
             f"  GPU memory    {plan.required_mib} MiB needed; "
             + ("; ".join(f"GPU {g['index']}: {g.get('free_mib')} of {g.get('total_mib')} MiB free" for g in plan.gpus)
                or "no GPUs requested")]
    if service:
        lines.append(f"  service       {service.get('unit')} is {service.get('active_state')}: "
                     + ("WOULD BE STOPPED and restored afterwards" if plan.stop_service else "left running"))
    if plan.variants:
        how = (f"as one Slurm job array, at most {plan.array_parallel} at once (sweep.max_parallel)"
               if plan.array_parallel else "in one downtime window (one stop, one restore)")
        if plan.slots:
            how = (f"side by side on {len(plan.slots)} slots of {len(plan.slots[0])} GPUs "
                   f"(GPU {' · '.join(','.join(slot) for slot in plan.slots)}) {how}")
        lines.append(f"  sweep         {len(plan.variants)} variants {how}:")
        lines += [f"    {k + 1:>4}. {variant_label(v['args'])}" for k, v in enumerate(plan.variants)]
    for key, title in (("before_stop", "before the stop"), ("window", "in the window"), ("freed", "freed")):
        lines += [f"  {title if k == 0 else '':<15} {step}" for k, step in enumerate(plan.steps.get(key, []))]
    lines += [f"  note          {note}" for note in plan.notes]
    return "\n".join(lines)


TAIL_HELP = """Print the job's log bytes after the stored cursor, unchanged.

\b
The cursor moves only when a call ends by itself (exit 0, 1 or 75, after its output is written): a call
killed by your tool (timeout, SIGKILL) leaves it where it was, so its bytes come again with the next call,
and the calls that ended by themselves join to the log byte for byte. Two tails of one job take turns (one
waits up to --max-wait for the other, then says "call again"). `watch` never moves the cursor.

\b
Exit: 0 SUCCEEDED and all printed · 1 ended otherwise · 75 still running, call again · 2 unknown job,
bad usage, or a state dir that cannot be written (checked before the host) · 3 host unreachable, or the
host's log is shorter than the cursor (it shrank or was replaced): the cursor is reset to 0 and the next
call prints the log from its first byte (repeats, never a gap).
"""


@cli.command(help=TAIL_HELP)
@click.argument("job_id")
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends or --max-wait passes.")
@click.option("--max-wait", type=click.FloatRange(0, 3600), default=DEFAULT_MAX_WAIT, show_default=True,
              help="Seconds this call may wait for new output (stay under your tool timeout).")
@click.option("--from-start", is_flag=True, help="Print from the first byte, not from the cursor.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (output decoded as UTF-8, lossy).")
def tail(job_id: str, follow: bool, max_wait: float, from_start: bool, as_json: bool) -> None:
    if _is_run(job_id):
        from . import fleet_cli

        if as_json:
            raise SpecError("tail --json takes one job id; for a run, tail one of its jobs (RUN.N) or drop --json")
        sys.exit(fleet_cli.tail(job_id, follow=follow, max_wait=max_wait, from_start=from_start))
    _tail_and_exit(job_id, follow=follow, max_wait=max_wait, from_start=from_start, as_json=as_json)


def _tail_and_exit(job_id: str, *, follow: bool, max_wait: float, from_start: bool, as_json: bool) -> None:
    from ..commands import controller

    sink = _Capture() if as_json else sys.stdout.buffer

    def delivered(outcome: controller.TailOutcome) -> None:
        """Everything this call says, written before the cursor moves (the move is its last step)."""
        if as_json:
            _emit_json({**asdict(outcome), "output": sink.text()})
            sys.stdout.flush()
        elif outcome.busy:
            _progress(f"[runner] another `runner tail {job_id}` held the cursor for --max-wait; call again")
        elif not outcome.terminal:
            _progress(f"[runner] {job_id} still {outcome.state}; call again")
        else:
            _progress(f"[runner] {job_id} ended {outcome.state}{_exit_note(outcome.exit_code)}")

    outcome = controller.tail(job_id, store=Store(), out=sink, follow=follow, max_wait=max_wait,
                              from_start=from_start, delivered=delivered)
    sys.exit(exit_code(outcome.state, settled=outcome.terminal))


class _Capture:
    def __init__(self) -> None:
        self.buf = bytearray()

    def write(self, data: bytes) -> None:
        self.buf += data

    def flush(self) -> None:
        pass

    def text(self) -> str:
        return self.buf.decode("utf-8", "replace")


@cli.command(help="Follow the job for a person: a live panel (phase, rows done, recent events) on a terminal, "
                  "plain lines otherwise; `tail` keeps the raw bytes. Never moves tail's cursor. " + JOB_EXITS)
@click.argument("job_id")
@click.option("--max-wait", type=click.FloatRange(0, WATCH_UNTIL_END), default=None,
              help=f"Seconds to watch before returning 75 [default: on a terminal until the job ends, else "
                   f"{DEFAULT_MAX_WAIT:g}].")
@click.option("--plain", is_flag=True, help="Plain lines even on a terminal.")
def watch(job_id: str, max_wait: float | None, plain: bool) -> None:
    from ..commands import controller
    from .watch import LivePanel, plain_sink

    max_wait = watch_bound(max_wait, on_terminal=sys.stdout.isatty())

    def follow(sink):
        return controller.tail(job_id, store=Store(), out=sink, follow=True, max_wait=max_wait, from_start=True,
                               save_cursor=False)

    if plain or not sys.stdout.isatty():
        sink = plain_sink(sys.stdout)
        outcome = follow(sink)
        sink.close()
    else:
        with LivePanel(f"runner watch {job_id}") as sink:
            outcome = follow(sink)
    if outcome.terminal:
        _progress(f"[runner] {job_id} ended {outcome.state}{_exit_note(outcome.exit_code)}")
    else:
        _progress(f"[runner] {job_id} still running; `runner watch {job_id}` again to go on "
                  f"(this watch ended after --max-wait {max_wait:g} s)")
    sys.exit(exit_code(outcome.state, settled=outcome.terminal))


def watch_bound(max_wait: float | None, *, on_terminal: bool) -> float:
    """--max-wait, else: a person at a terminal watches until the job ends; a script or an agent gets the
    bound that fits a tool call."""
    if max_wait is not None:
        return max_wait
    return WATCH_UNTIL_END if on_terminal else DEFAULT_MAX_WAIT


@cli.command(help="State, phase, progress, service and downtime of one job (or, with no id, of the 50 newest jobs "
                  "this controller knows and every one not yet ended; --all: every job). "
                  "Exit: like tail for one job; for all, the worst wins (1 > 3 > 75 > 0: a host that cannot be "
                  "asked is its jobs' lines and 3, the others still shown). 2 unknown id · 3.")
@click.argument("job_id", required=False)
@click.option("--all", "every", is_flag=True, help="With no id: every job this controller knows, not only the "
              "50 newest and those not yet ended.")
@click.option("--max-wait", type=click.FloatRange(0, 3600), default=DEFAULT_MAX_WAIT, show_default=True,
              help="Seconds this call may take, plus one round trip (then exit 3).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def status(job_id: str | None, every: bool, max_wait: float, as_json: bool) -> None:
    from ..fleet import targets

    found = targets.status(job_id, store=Store(), deadline=Deadline.for_command(max_wait), every=every)
    if found.of_run:
        from . import fleet_cli

        sys.exit(fleet_cli.status(found, as_json=as_json))
    if as_json:
        _emit_json(found.document)
    else:
        if not job_id and not found.detail:
            _progress("no jobs yet (`runner submit JOB.yaml`)")
        for job in found.detail:
            _say(_status_text(job))
    sys.exit(found.exit)


def _is_run(ref: str) -> bool:
    """A fleet run's id (one job per host) rather than one job's: the fleet_cli commands take it. The run
    store alone, not fleet_view (the rollout's modules): a job's tail or status never needs them."""
    from ..state.fleet_store import is_run

    return is_run(ref, Store())


def _status_text(job: dict) -> str:
    from ..fleet.fleet_view import service_states

    if job.get("error"):  # its host was not asked: unreachable, a refused key or login
        return f"{job.get('job_id')}: last known {job.get('state')} ({job.get('message')})"
    head = f"{job.get('job_id')}: {job.get('state')}" + (f" ({job['phase']})" if job.get("phase") else "")
    lines = [head]
    now = job.get("now") or time.time()
    started = job.get("started_at") or job.get("created_at")
    if started:
        end = job.get("ended_at") or now
        lines.append(f"  elapsed     {_duration(end - started)}")
    progress = job.get("progress")
    if progress:
        sweep = progress.get("sweep") if isinstance(progress.get("sweep"), dict) else {}
        rows = progress["rows_done"]
        rows_text = f"{rows} of {progress['rows_expected']}" if progress.get("rows_expected") else str(rows)
        whose = " (the sweep's: its variants run side by side)" if sweep.get("side_by_side") is True else ""
        lines.append(f"  payload     phase {_phase_text(progress)}, rows {rows_text}{whose}, "
                     f"last output {progress.get('silent_s', 0):.0f} s ago")
        variant = progress.get("variant")
        if sweep.get("side_by_side") is True:
            lines.append(f"  sweep       {_sweep_text(sweep)}")
        elif variant:
            lines.append(f"  sweep       variant {variant['index']} of {variant['of']}: {variant_label(variant['args'] or {})}"
                         + (" (skipped)" if variant.get("status") == "skipped" else "")
                         + (f"; the sweep: {_sweep_text(sweep)}" if sweep else ""))
    slots = job.get("slots")
    if isinstance(slots, list) and len(slots) > 1 and not is_terminal(job.get("state", "")):  # side by side
        lines.append("  slots       " + " · ".join(_slot_text(slot) for slot in slots if isinstance(slot, dict)))
    service = job.get("service") or {}
    slurm, array = job.get("slurm") or {}, job.get("array")
    if array:  # a sweep on Slurm: one job array
        reasons = ", ".join(array.get("reasons") or {})
        lines.append(f"  array       slurm {slurm.get('job_id')}: {array['done']} of {array['of']} done "
                     f"({array['succeeded']} succeeded, {array['failed']} failed, {array['skipped']} skipped), "
                     f"{array['running']} running, {array['pending']} pending" + (f" ({reasons})" if reasons else ""))
    elif slurm.get("job_id"):
        lines.append(f"  scheduler   slurm {slurm['job_id']} {slurm.get('state') or '?'}"
                     + (f" ({slurm['reason']})" if slurm.get("reason") else "")
                     + (f" on {slurm['node']}" if slurm.get("node") else ""))
    several = [s for s in job.get("services") or [] if isinstance(s, dict) and s.get("unit")]
    for one in several or ([service] if service.get("unit") else []):
        freed = (" (freed)" if one.get("stopped") else " (not freed)") if several else ""
        lines.append(f"  service     {one['unit']} {service_states(one)}{freed}" + _stop_result(one)
                     + _downtime(one, now))
    kept = [u for u in job.get("services_kept") or [] if isinstance(u, str)]
    if kept:
        lines.append(f"  kept        {', '.join(kept)} serving (not on the job's GPUs: never touched)")
    if job.get("exit_code") is not None:
        lines.append(f"  payload exit code {job['exit_code']}")
    if job.get("message"):
        lines.append(f"  why         {job['message']}")
    return "\n".join(lines)


def _sweep_text(sweep: dict) -> str:
    """`1 of 4 variants done, running 2, 3, rows 11 of 32 in all`: the host's tally of a sweep (progress.py)."""
    def count(key: str):  # the host's numbers: anything else is shown as unknown
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


def _exit_note(code: int | None) -> str:
    """The payload's exit code when it has one (a job cancelled before its payload started has none)."""
    return "" if code is None else f" (payload exit code {code})"


def _phase_text(progress: dict) -> str:
    """The payload's phase as of its last event: one that ended (rows may already be coming) says so."""
    phase = progress.get("phase")
    if not phase:
        return "-"
    return phase + {"end": " ended", "error": " failed"}.get(progress.get("phase_status"), "")


def _stop_result(service: dict) -> str:
    """A unit our stop left failed (its engine's own shutdown under the SIGTERM) is said to be that, not a fault."""
    stop_result = service.get("stop_result")
    if not isinstance(stop_result, dict) or service.get("now") != "failed":
        return ""
    result = printable(str(stop_result.get("result")), multiline=False)[:40]  # the host's text
    return f" (left failed by this job's stop, Result={result}; reset and started at the restore)"


def _downtime(service: dict, now: float) -> str:
    if service.get("downtime_s") is not None:
        return f", downtime {service['downtime_s']:.1f} s" + _downtime_parts(service.get("downtime"))
    if service.get("stopped_at") and not service.get("restored_at"):
        return f", down for {_duration(now - service['stopped_at'])} so far"
    return ""


def _downtime_parts(parts: dict | None) -> str:
    """" (stop: release 0.8, drain 0.0, payload 22.2, resume 3.5, health 5.8 s)": the window's parts."""
    known = _window_parts(parts or {})
    return (f" ({parts['method']}: {known} s)" if known else "") + _clients_text(parts or {})


def _clients_text(window: dict) -> str:
    """"; clients: 4 in flight at the pause, 4 completed, 0 aborted (drained in 2.1 s)": what SGLang said became
    of the requests it held when the window began (its load before the pause), under the pause mode."""
    clients = window.get("clients")
    if not isinstance(clients, dict):
        return ""

    def count(key: str) -> str:
        value = clients.get(key)
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else "?"
    drained = clients.get("drained_s")
    after = f" (drained in {drained:.1f} s)" if isinstance(drained, (int, float)) and not isinstance(drained, bool) \
        else ""
    gave_up = clients.get("drain_timed_out_s")
    if isinstance(gave_up, (int, float)) and not isinstance(gave_up, bool):
        after = f" (not idle after a {gave_up:.1f} s drain: drain_fallback abort)"
    mode = window.get("pause_mode")
    return (f"; clients{f' ({printable(mode)})' if isinstance(mode, str) else ''}: {count('in_flight')} in flight "
            f"at the pause, {count('completed')} completed, {count('aborted')} aborted{after}")


def _window_parts(parts: dict) -> str:
    """"release 0.8, drain 0.0, payload 22.2, resume 3.5, health 5.8": the parts that are numbers."""
    return ", ".join(f"{name} {parts[name + '_s']:.1f}" for name in ("release", "drain", "payload", "resume", "health")
                     if isinstance(parts.get(name + "_s"), (int, float)) and not isinstance(parts[name + "_s"], bool))


def _window_lines(window: dict) -> list[str]:
    """`results`' lines on the services: one window, or one per freed service (`services`), each unit named."""
    several = [w for w in window.get("services") or [] if isinstance(w, dict)]
    return [_window_text(w, w.get("unit")) for w in several] if several else [_window_text(window)]


def _window_text(window: dict, unit: str | None = None) -> str:
    """One window: "service window (stop): not serving 26.2 s (release 0.5, … s)", "service window of U (stop)…"."""
    total = window.get("not_serving_s")
    shown = f"{total:.1f} s" if isinstance(total, (int, float)) and not isinstance(total, bool) else "?"
    parts = _window_parts(window)
    return (f"service window{f' of {unit}' if unit else ''} ({window.get('method')}): not serving {shown}"
            + (f" ({parts} s)" if parts else "") + _clients_text(window))


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{seconds:.1f} s" if seconds < 120 else f"{int(seconds // 60)} min {int(seconds % 60)} s"


@cli.command(name="list", help="Jobs this controller knows (local index, no network; states as last seen): the 50 "
                               "newest and every one not yet ended; --all: every job.")
@click.option("--all", "every", is_flag=True, help="Every job this controller knows, oldest first.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def list_jobs(every: bool, as_json: bool) -> None:
    records, skipped, older = (*Store().scan(), 0) if every else Store().recent()
    for problem in skipped:
        _progress(f"runner: skipped: {problem}")
    if older:
        _progress(f"runner: {older} older ended jobs not shown (`runner list --all`)")
    if as_json:
        _emit_json([asdict(r) for r in records])
        return
    rows = [tuple(printable(str(cell), multiline=False) for cell in (
        r.job_id, r.last_state, r.host["address"], time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.submitted_at)),
        r.name)) for r in records]
    header = ("JOB ID", "STATE", "HOST", "SUBMITTED", "NAME")
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        _say("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip())


@cli.command(help="Stop the job's payload (TERM, grace, KILL of its process group); the host then restores the "
                  "service. Exit: 0 requested or already ended · 2 · 3.")
@click.argument("job_id")
@click.option("--max-wait", type=click.FloatRange(0, 3600), default=DEFAULT_MAX_WAIT, show_default=True,
              help="Seconds this call may take, plus one round trip (then exit 3).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def cancel(job_id: str, max_wait: float, as_json: bool) -> None:
    from ..fleet import targets
    from . import fleet_cli

    found = targets.cancel(job_id, store=Store(), deadline=Deadline.for_command(max_wait))
    if found.of_run:
        sys.exit(fleet_cli.cancel(found, as_json=as_json))
    answer = found.document
    if as_json:
        _emit_json(answer)
    elif answer.get("already"):
        _progress(f"{job_id} already ended {answer.get('state')}; nothing to cancel")
    else:
        _progress(f"cancel requested: {job_id} was {answer.get('state')}; follow with `runner tail {job_id} -f`")


@cli.command(help="Print the job spec's JSON Schema (for editors: `# yaml-language-server: $schema=FILE`). "
                  "The same reference as a table: docs/spec-reference.md.")
def schema() -> None:
    from ..spec.spec_reference import json_schema

    _emit_json(json_schema())


@cli.command(name="restore-service",
             help="Start the service if inactive and wait until healthy; idempotent; says whether it started "
                  "the unit or found it up. Give JOB.yaml (its host and service sections; --host: its service on "
                  "that host instead), or --host and --unit. Exit: 0 healthy · 75 still starting · 1 failed "
                  "(the unit's log is printed) · 2 · 3 · 4 the host cannot manage the unit (no systemd there).")
@click.argument("job_file", required=False)
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a field of JOB.yaml.")
@click.option("--host", "address", default=None, help="ssh_config alias or hostname ('local' for this machine).")
@click.option("--user", default=None, help="Login user (overrides the ssh_config alias's User, like ssh -l).")
@click.option("--port", type=int, default=None, help="SSH port (overrides the alias's Port, like ssh -p).")
@click.option("--unit", default=None, help="systemd unit name (NAME means NAME.service).")
@click.option("--scope", type=click.Choice(["system", "user"]), default="system", show_default=True,
              help="system units, or the login user's own manager (systemctl --user).")
@click.option("--sudo", is_flag=True, help="Run systemctl through `sudo -n` (needs a NOPASSWD rule).")
@click.option("--health-url", default=None, help="http(s) URL that answers 2xx once the service is ready; "
              "without it the unit must stay active for 2 s.")
@click.option("--host-key-policy", type=click.Choice(["strict", "accept-new"]), default="strict", show_default=True,
              help="strict: the key must be in known_hosts; accept-new: record an unknown key once.")
@click.option("--max-wait", type=click.FloatRange(0, 3600), default=DEFAULT_MAX_WAIT, show_default=True,
              help="Seconds to wait for healthy before returning 75 (the start goes on).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def restore_service(job_file, overrides, address, user, port, unit, scope, sudo, health_url, host_key_policy,
                    max_wait, as_json) -> None:
    from ..commands import controller

    host, service = controller.restore_target(job_file, address=address, unit=unit, overrides=overrides, user=user,
                                              port=port, scope=scope, sudo=sudo, health_url=health_url,
                                              host_key_policy=host_key_policy)
    answer = controller.restore_service(host, service, max_wait=max_wait)
    if as_json:
        _emit_json(answer)
    else:
        _say(f"{service['unit']}: {answer.get('state')} ({answer.get('active_state')}/{answer.get('sub_state')})"
             + _restore_action(answer))
        if answer.get("state") == "failed" and answer.get("log_tail"):
            _say(answer["log_tail"])
    sys.exit(exit_code(answer.get("state")))


@cli.command(help="Delete the host's old job dirs and unused bundles by its retention rule (also applied, at most "
                  "10 deletions, at every submit): a job dir goes once it is not among the newest --keep-jobs, "
                  "older than --keep-days, ended, owes no stop and holds no lock. HOST_OR_JOB: JOB.yaml (its host "
                  "section) or a host address. Exit: 0 · 2 · 3.")
@click.argument("host_or_job")
@click.option("--keep-jobs", type=click.IntRange(0), default=200, show_default=True, help="Newest job dirs kept.")
@click.option("--keep-days", type=click.FloatRange(0), default=14.0, show_default=True,
              help="Job dirs younger than this are kept.")
@click.option("--dry-run", is_flag=True, help="List what would go; delete nothing.")
@click.option("--max-wait", type=click.FloatRange(0, 3600), default=DEFAULT_MAX_WAIT, show_default=True,
              help="Seconds this call may take, plus one round trip (then exit 3).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def gc(host_or_job, keep_jobs, keep_days, dry_run, max_wait, as_json) -> None:
    from ..commands import controller

    answer = controller.gc(host_or_job, keep_jobs=keep_jobs, keep_days=keep_days, dry_run=dry_run,
                           deadline=Deadline.for_command(max_wait))
    if as_json:
        _emit_json(answer)
        return
    verb = "would delete" if dry_run else "deleted"
    for kind, what in (("jobs", "job dir"), ("payloads", "payload bundle"), ("supervisors", "supervisor bundle")):
        for name in answer[kind]:
            _say(f"{verb} {what} {name}")
    _say(f"{answer['host']}: {verb} {len(answer['jobs'])} job dirs, "
         f"{len(answer['payloads']) + len(answer['supervisors'])} bundles; kept {answer['kept']} job dirs")


def _restore_action(answer: dict) -> str:
    """What restore-service did: started the unit, or found it up (an older host does not say)."""
    if answer.get("started") is True:
        return f": started it (it was {answer.get('was') or 'not running'})"
    return ": it was up already (not started)" if answer.get("started") is False else ""


def main(argv: list[str] | None = None) -> None:
    """The one place that turns errors into messages and exit codes."""
    try:
        cli.main(args=argv, prog_name="runner", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        _fail(argv, CODE_USAGE, exc.format_message(), _usage_hint(exc), EXIT_USAGE)
    except click.Abort:
        _fail(argv, CODE_ABORTED, "aborted", "", EXIT_ABORTED)
    except RunnerError as exc:
        _fail(argv, exc.code, str(exc), exc.hint, exc.exit_code)
    except BrokenPipeError:
        sys.exit(EXIT_FAILED)
    sys.exit(EXIT_OK)


def _usage_hint(exc: click.ClickException) -> str:
    ctx = getattr(exc, "ctx", None)
    return f"`{ctx.command_path} --help` lists its arguments and options." if ctx is not None else ""


def _fail(argv, error: str, message: str, hint: str, code: int) -> None:
    """An error as text on stderr, or with --json as one JSON object on stdout (an agent parses one format);
    a usage error too, as one `runner: error:` line (no usage block), like every other error. `error` is the
    stable kebab-case code (errors.py), the same word MCP tool errors and the wire use."""
    args = sys.argv[1:] if argv is None else argv
    if "--json" in args:
        _emit_json({"error": error, "message": message, "hint": hint, "exit": code})
    else:
        _progress(f"runner: error: {message}")
        if hint:
            _progress(f"runner: hint: {hint}")
    sys.exit(code)


# -- results, the regression gate, history, wait, mcp (logic in ci.py, gate.py, history.py, mcp_server.py) --

def _tolerance(_ctx, _param, value: str) -> float:
    from ..results.gate import parse_tolerance

    try:
        return parse_tolerance(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@cli.command(name="results", help="Fetch the job's result.json: a table, a lever plot, a regression gate "
                                  "against a baseline, or two runs side by side. ID is a job id, or a result.json "
                                  "path: one with a `/`, or an existing file that is no known job id (so "
                                  "`./run-7.json` for a file named like a job).\n\n"
                                  "Exit: 0 · 1 no result (the message says the job's state and why) · 75 still "
                                  "running, call again · 2 · 3; "
                                  "with --baseline: 0 within, 1 regression or missing metric, 2 bad baseline.")
@click.argument("job_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print result.json as one JSON document, whatever its shape "
              "(strict JSON: NaN and Infinity as null; result.json files over 32 MB are refused).")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png", help="Plot the rows (the lever figure for the Marlin benchmark).")
@click.option("--baseline", "baseline_path", default=None, metavar="FILE", help="Gate against this baseline file.")
@click.option("--save-baseline", "save_path", default=None, metavar="FILE", help="Write this result's metrics as a baseline.")
@click.option("--compare", "other", default=None, metavar="ID2", help="Show ID and ID2 (id or result.json) side by side.")
@click.option("--tolerance", default="5%", callback=_tolerance, show_default=True,
              help="Allowed worsening on top of each metric's measured spread (5% or 0.05).")
@click.option("--format", "fmt", type=click.Choice(["text", "markdown", "junit"]), default="text", show_default=True,
              help="Gate output: a text table, GitHub markdown ($GITHUB_STEP_SUMMARY) or JUnit XML.")
@click.option("--max-wait", type=click.FloatRange(0, 3600), default=DEFAULT_MAX_WAIT, show_default=True,
              help="Seconds this call may take, plus one round trip (then exit 3).")
def results(job_id, as_json, plot_path, baseline_path, save_path, other, tolerance, fmt, max_wait) -> None:
    from ..commands import ci
    from ..results import gate, gate_report
    from . import fleet_cli

    if _is_run(job_id) and not (baseline_path or save_path or other):
        sys.exit(fleet_cli.results(job_id, as_json=as_json, plot_path=plot_path,
                                   deadline=Deadline.for_command(max_wait)))
    store = Store()
    deadline = Deadline.for_command(max_wait)
    current = ci.collect(job_id, store=store, deadline=deadline)
    if current.window and not as_json:
        for line in _window_lines(current.window):
            _progress(line)
    if current.warning:
        _progress(current.warning)
    if save_path:
        document = gate.write_baseline(save_path, current.result, current.source)
        _progress(f"wrote {save_path}: {len(document['metrics'])} metrics from {current.source}")
    if baseline_path:
        verdicts = ci.gate_against(baseline_path, current, tolerance)
        _say(gate_report.render(verdicts, fmt, baseline=baseline_path, current=current.source,
                                tolerance=tolerance, notes=ci.gate_clock_lines(baseline_path, current)), nl=False)
        sys.exit(gate.exit_code(verdicts))
    if other:
        second = ci.collect(other, store=store, deadline=deadline)
        verdicts = ci.compare_runs(current, second, tolerance)
        _say(gate_report.side_by_side(current.result, second.result, verdicts,
                                      name_a=current.source, name_b=second.source), nl=False)
    elif as_json:
        _emit_result_json(current.result)
    elif not save_path:
        from ..results.results import render_checked

        text, notes = render_checked(current.result)
        for note in notes:
            _progress(f"runner: {note}")
        _say(text)
    if plot_path:
        from ..results.results import plot

        plot(current.result, plot_path)
        _progress(f"wrote {plot_path}")


def _emit_result_json(result) -> None:
    """result.json as strict JSON: NaN and ±Infinity (which Python writes, most parsers refuse) become null."""
    from ..results.results import json_text

    text, replaced = json_text(result)
    if replaced:
        _progress(f"runner: the result holds {replaced} NaN/Infinity values; --json prints them as null")
    click.echo(text)


@cli.command(help="Recorded results (every `runner results ID` records one): list, or plot a metric over runs.")
@click.option("--host", default=None, help="Only runs on this host (the spec's host.address).")
@click.option("--metric", default=None, metavar="NAME", help="Only runs with this metric, shown in the table "
              "(e.g. lever_512, median_us_1, peak_over_weights; default column lever_512).")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png", help="Plot the metric (default lever_512).")
@click.option("--import", "imports", multiple=True, metavar="RESULT.json",
              help="Record result files first (job id = the path as given); repeatable.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def history(host, metric, plot_path, imports, as_json) -> None:
    from ..commands.ci import collect
    from ..results import history as hist
    from ..results import history_report

    store = Store()
    path = hist.db_path(store.root)
    deadline = Deadline.for_command(DEFAULT_MAX_WAIT_S)  # an import of a job id asks its host
    for ref in imports:
        warning = hist.record(path, *hist.runs_from_result(ref, collect(ref, store=store, record=False,
                                                                        deadline=deadline).result))
        if warning:
            raise RunnerError(warning)
    known = hist.metric_names(path)
    if metric and known and metric not in known:
        raise SpecError(f"--metric {metric}: no recorded run has it; known metrics: {', '.join(known)}")
    shown = metric or history_report.default_metric(known)
    runs = hist.runs(path, host=host, metric=metric or (shown if plot_path else None))
    every = hist.runs(path) if runs else []  # the variants are named over all of them, whatever is shown
    if as_json:
        from ..results.results import strict_json

        _emit_json(strict_json([asdict(r) for r in runs]))
    else:
        _say(history_report.render(runs, shown if runs else metric, every), nl=False)
    if plot_path:
        if not metric and shown != history_report.DEFAULT_METRIC:
            _progress(f"plotting {shown}: no recorded run has {history_report.DEFAULT_METRIC} (--metric picks another)")
        history_report.plot(runs, shown, plot_path, every=every)
        _progress(f"wrote {plot_path}")


@cli.command(help="Block until the job ends, printing its log as it comes (for CI; agents use `tail`). For a "
                  "fleet run: drive its rollout until every host is done or --timeout passes.\n\n"
                  "Exit codes: 0 SUCCEEDED · 1 ended otherwise · 75 still running at --timeout · 2 · 3")
@click.argument("job_id")
@click.option("--timeout", "timeout", default="30m", show_default=True, metavar="DURATION",
              help="Give up after this long (30s, 5m, 1h).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document at the end (the log still streams).")
def wait(job_id: str, timeout: str, as_json: bool) -> None:
    from ..commands import ci
    from ..spec.spec_fields import parse_duration
    from . import fleet_cli

    try:
        seconds = parse_duration(timeout)
    except ValueError as exc:
        raise SpecError(f"--timeout: {exc}") from None
    if _is_run(job_id):
        sys.exit(fleet_cli.wait(job_id, max_wait=seconds, as_json=as_json))
    outcome = ci.wait(job_id, store=Store(), out=sys.stdout.buffer, timeout=seconds, progress=_progress)
    if as_json:
        _emit_json(asdict(outcome))
    if not outcome.terminal:
        _progress(f"[runner] {job_id} still {outcome.state} after {timeout}; it keeps running on the host: "
                  f"`runner wait {job_id}` again goes on from here (`runner cancel {job_id}` stops it)")
    else:
        _progress(f"[runner] {job_id} ended {outcome.state}{_exit_note(outcome.exit_code)}")
    sys.exit(exit_code(outcome.state, settled=outcome.terminal))


@cli.command(help="Serve the runner's commands as MCP tools over stdio (needs the `mcp` extra). Least privilege "
                  "by default: job files only from the jobs dirs, overrides only of parameters (payload.args, "
                  "sweep, limits, gpu, name), results by job id, no `local` host (docs/agents-ci.md).\n\n"
                  "Client config: {\"command\": \"runner\", \"args\": [\"mcp\"]}")
@click.option("--jobs-dir", "jobs_dirs", multiple=True, metavar="DIR",
              help="Job files the agent may submit or restore (repeatable; default: ./jobs).")
@click.option("--baselines-dir", "baselines_dirs", multiple=True, metavar="DIR",
              help="Baseline files the agent may gate against (repeatable; default: ./baselines).")
@click.option("--allow-overrides", is_flag=True, help="Let calls override any key, what runs and where included.")
@click.option("--allow-local", is_flag=True, help="Let jobs and restores use host `local` (this machine).")
def mcp(jobs_dirs, baselines_dirs, allow_overrides, allow_local) -> None:
    from pathlib import Path

    from ..mcp.mcp_policy import Policy

    try:
        from ..mcp.mcp_server import serve
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in ("runner", "remote_payload"):
            raise
        raise SpecError(f"`runner mcp` needs the MCP SDK (no module {exc.name!r})",
                        hint="pip install 'runner[mcp]'") from None
    serve(Policy.for_project(Path.cwd(), jobs_dirs, baselines_dirs, allow_overrides=allow_overrides,
                             allow_local=allow_local))
