"""The `runner` command line. The only module that prints errors or exits: `main` for errors (each carries
its code, errors.py), `exit_code` for what a command found (a job's or a service's state).

Human output goes to stdout, progress and messages to stderr; `--json` prints one JSON document.
"""
from __future__ import annotations

import io
import os
import sys
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, BinaryIO

import click

from remote_payload.sweep import label as variant_label

from .. import __version__
from ..commands import render
from ..deadline import DEFAULT_MAX_WAIT_S, MAX_WAIT_LIMIT_S, ROUND_TRIP_ALLOWANCE_S, Deadline
from ..errors import CODE_USAGE, EXIT_FAILED, EXIT_OK, EXIT_USAGE, Interrupted, RunnerError, SpecError, exit_code
from ..printable import printable
from ..state.store import Store
from ..verbose import ENV as ENV_DEBUG
from . import results_commands
from .cli_echo import emit_json as _emit_json
from .cli_echo import progress as _progress
from .cli_echo import say as _say

if TYPE_CHECKING:
    from ..commands.controller import ByteSink, TailOutcome
    from ..commands.plan import DryRun

# Each command imports what it runs when it runs: `runner list` needs neither the controller nor the host protocol.
WATCH_UNTIL_END = 86400.0  # `runner watch` on a terminal: until the job ends (a day at most)

EXIT_CODES_HELP = """\b
Exit codes (every command; `--json` errors are JSON objects {error, message, hint, exit}):
  0   done / accepted / healthy / SUCCEEDED
  1   the job ended other than SUCCEEDED, no result, or the service failed to come back
  2   bad job spec or usage, unknown job id (the message names the file and field), the local
      state dir cannot be written, RUNNER_SSH_CONFIG cannot be read
  3   host unreachable, authentication failed, host key unknown or changed, the host answered
      outside the wire contract; tail: the host's log is shorter than the cursor
  4   preflight refused (GPU memory short and the policy forbids stopping, GPU missing,
      need > total, a start condition such as a missing interpreter, an engine that cannot
      free its memory, no such unit, a health URL that does not answer); nothing was touched
  5   host busy: another job holds the lock (the message names it)
  75  still running / still starting: call again
  130 interrupted (Ctrl-C, SIGTERM); submit cancels the job it was starting and says so
"""
JOB_EXITS = "Exit: 0 SUCCEEDED · 1 ended otherwise · 75 still running · 2 · 3 (see `runner --help`)."


@click.group(help="Detached remote benchmark jobs over SSH that stop a GPU service, run, and bring it back.\n\n"
                  + EXIT_CODES_HELP)
@click.version_option(version=__version__, prog_name="runner")
@click.option("-v", "--verbose", is_flag=True, help="Say each ssh command, supervisor call and upload on stderr, with its "
              "time (also RUNNER_DEBUG=1).")
def cli(verbose: bool) -> None:
    if verbose:
        os.environ[ENV_DEBUG] = "1"  # read by runner.verbose, and by the child processes runner starts


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
@click.option("--max-wait", type=click.FloatRange(0, MAX_WAIT_LIMIT_S), default=DEFAULT_MAX_WAIT_S, show_default=True,
              help="Seconds this call may take, plus one round trip (a link that goes silent: exit 3; submit "
                   "again with the same --job-id). With --follow: the log is followed until then, then 75. A "
                   "fleet (a list of hosts): seconds to drive the rollout before returning 75 (`runner wait RUN` "
                   "goes on).")
@click.option("--forks", type=click.IntRange(1, 256), default=None, metavar="N",
              help="A fleet: at most N host calls at once (default: the spec's rollout.forks, 16).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def submit(job_file: str, overrides: tuple[str, ...], queue: bool, queue_timeout: str | None, job_id: str | None,
           dry_run: bool, follow: bool, max_wait: float, forks: int | None, as_json: bool) -> None:
    from ..commands import controller
    from ..commands.interrupts import Interrupts

    if queue_timeout is not None:
        overrides, queue = (*overrides, "limits.queue_timeout=" + queue_timeout), True
    deadline, store = Deadline.for_command(max_wait), Store()
    with Interrupts() as interrupts:  # Ctrl-C or SIGTERM: exit 130 saying what became of the job
        plan = controller.local_plan(job_file, overrides)  # the command's one validation
        if plan.is_fleet:
            from . import fleet_cli

            interrupts.unheld = "the hosts' jobs started so far go on (`runner list` shows them)"
            sys.exit(fleet_cli.submit(plan, run_id=job_id, queue=queue, dry_run=dry_run, max_wait=max_wait,
                                      as_json=as_json, forks=forks))
        if forks is not None:
            raise SpecError("--forks goes with a fleet (a list of hosts in host.address); this spec names one host")
        if dry_run:
            decided = controller.dry_run(job_file, list(overrides), queue=queue, job_id=job_id, planned=plan,
                                         deadline=deadline)
            _emit_json(asdict(decided)) if as_json else _say(_dry_run_text(decided))
            return
        done = controller.submit(job_file, list(overrides), queue=queue, job_id=job_id, store=store,
                                 progress=_progress, planned=plan, deadline=deadline, interrupts=interrupts)
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


def _dry_run_text(plan: DryRun) -> str:
    service = plan.service or {}
    lines = [f"dry run on {plan.host}: nothing was started or changed",
             f"  job id        {plan.job_id}",
             f"  command       {' '.join(plan.argv)}",
             f"  GPU memory    {plan.required_mib} MiB needed; "
             + ("; ".join(f"GPU {g['index']}: {g.get('free_mib')} of {g.get('total_mib')} MiB free" for g in plan.gpus)
                or "no GPUs requested")]
    if plan.bundle:
        lines.append(f"  payload       {plan.bundle['files']} files, {plan.bundle['bytes'] / (1 << 20):.1f} MiB "
                     f"(bundle {plan.bundle['digest']}; sent only where the host lacks it)")
    if service:
        engine = service.get("engine") if isinstance(service.get("engine"), dict) else None
        freed = (f"its GPU memory WOULD BE RELEASED through its {printable(str(engine.get('engine')))} API and "
                 "resumed afterwards; the unit keeps running (the note says how)" if engine
                 else "WOULD BE STOPPED and restored afterwards")
        lines.append(f"  service       {service.get('unit')} is {service.get('active_state')}: "
                     + (freed if plan.stop_service else "left running"))
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
@click.option("--max-wait", type=click.FloatRange(0, MAX_WAIT_LIMIT_S), default=DEFAULT_MAX_WAIT_S, show_default=True,
              help="Seconds this call may wait for new output (stay under your tool timeout).")
@click.option("--from-start", is_flag=True, help="Print from the first byte, not from the cursor.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (output decoded as UTF-8, lossy).")
def tail(job_id: str, follow: bool, max_wait: float, from_start: bool, as_json: bool) -> None:
    if Store().is_run(job_id):
        from . import fleet_cli

        if as_json:
            raise SpecError("tail --json takes one job id; for a run, tail one of its jobs (RUN.N) or drop --json")
        sys.exit(fleet_cli.tail(job_id, follow=follow, max_wait=max_wait, from_start=from_start))
    _tail_and_exit(job_id, follow=follow, max_wait=max_wait, from_start=from_start, as_json=as_json)


def _tail_and_exit(job_id: str, *, follow: bool, max_wait: float, from_start: bool, as_json: bool) -> None:
    from ..commands import controller

    captured = io.BytesIO()  # --json: the output goes into the document
    sink: BinaryIO = captured if as_json else sys.stdout.buffer

    def delivered(outcome: controller.TailOutcome) -> None:
        """Everything this call says, written before the cursor moves (the move is its last step)."""
        if as_json:
            _emit_json({**asdict(outcome), "output": captured.getvalue().decode("utf-8", "replace")})
            sys.stdout.flush()
        elif outcome.busy:
            _progress(f"[runner] another `runner tail {job_id}` held the cursor for --max-wait; call again")
        elif not outcome.terminal:
            _progress(f"[runner] {job_id} still {outcome.state}; call again")
        else:
            _progress(f"[runner] {job_id} ended {outcome.state}{render.exit_note(outcome.exit_code)}")

    outcome = controller.tail(job_id, store=Store(), out=sink, follow=follow, max_wait=max_wait,
                              from_start=from_start, delivered=delivered, on_wait=lambda: _progress(
                                  f"[runner] another `runner tail {job_id}` has the log's turn: waiting for it "
                                  "(up to --max-wait; each byte goes to one of them)"))
    sys.exit(exit_code(outcome.state, settled=outcome.terminal))


@cli.command(help="Follow the job for a person: a live panel (phase, rows done, recent events) on a terminal, "
                  "plain lines otherwise; `tail` keeps the raw bytes. Never moves tail's cursor. " + JOB_EXITS)
@click.argument("job_id")
@click.option("--max-wait", type=click.FloatRange(0, WATCH_UNTIL_END), default=None,
              help=f"Seconds to watch before returning 75 [default: on a terminal until the job ends, else "
                   f"{DEFAULT_MAX_WAIT_S:g}].")
@click.option("--plain", is_flag=True, help="Plain lines even on a terminal.")
def watch(job_id: str, max_wait: float | None, plain: bool) -> None:
    from ..commands import controller
    from .watch import LivePanel, plain_sink

    max_wait = watch_bound(max_wait, on_terminal=sys.stdout.isatty())

    def follow(sink: ByteSink) -> TailOutcome:
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
        _progress(f"[runner] {job_id} ended {outcome.state}{render.exit_note(outcome.exit_code)}")
    else:
        _progress(f"[runner] {job_id} still running; `runner watch {job_id}` again to go on "
                  f"(this watch ended after --max-wait {max_wait:g} s)")
    sys.exit(exit_code(outcome.state, settled=outcome.terminal))


def watch_bound(max_wait: float | None, *, on_terminal: bool) -> float:
    """--max-wait, else: a person at a terminal watches until the job ends; a script or an agent gets the
    bound that fits a tool call."""
    if max_wait is not None:
        return max_wait
    return WATCH_UNTIL_END if on_terminal else DEFAULT_MAX_WAIT_S


@cli.command(help="State, phase, progress, service and downtime of one job (or, with no id, of the 50 newest jobs "
                  "this controller knows and every one not yet ended; --all: every job). "
                  "Exit: like tail for one job (0 SUCCEEDED · 1 ended otherwise · 75 still running). With no "
                  "id, by the jobs still running (ended jobs do not count): 75 while one runs, 3 when a running "
                  "job's host cannot be asked (its lines say so, the others still shown), else 0. "
                  "2 unknown id · 3.")
@click.argument("job_id", required=False)
@click.option("--all", "every", is_flag=True, help="With no id: every job this controller knows, not only the "
              "50 newest and those not yet ended.")
@click.option("--max-wait", type=click.FloatRange(0, MAX_WAIT_LIMIT_S), default=DEFAULT_MAX_WAIT_S, show_default=True,
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
            _say(render.job_text(job))
    sys.exit(found.exit)


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
@click.option("--max-wait", type=click.FloatRange(0, MAX_WAIT_LIMIT_S), default=DEFAULT_MAX_WAIT_S, show_default=True,
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
                  "(the unit's log is printed) · 2 · 3 · 4 the host cannot manage the unit (no systemd there, no "
                  "such unit).")
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
@click.option("--max-wait", type=click.FloatRange(0, MAX_WAIT_LIMIT_S), default=DEFAULT_MAX_WAIT_S, show_default=True,
              help="Seconds to wait for healthy before returning 75 (the start goes on).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def restore_service(job_file: str | None, overrides: tuple[str, ...], address: str | None, user: str | None,
                    port: int | None, unit: str | None, scope: str, sudo: bool, health_url: str | None,
                    host_key_policy: str, max_wait: float, as_json: bool) -> None:
    from ..commands import upkeep

    host, service = upkeep.restore_target(job_file, address=address, unit=unit, overrides=overrides, user=user,
                                              port=port, scope=scope, sudo=sudo, health_url=health_url,
                                              host_key_policy=host_key_policy)
    answer = upkeep.restore_service(host, service, max_wait=max_wait)
    if as_json:
        _emit_json(answer)
    else:
        _say(f"{service['unit']}: {answer.get('state')} ({answer.get('active_state')}/{answer.get('sub_state')})"
             + _restore_action(answer))
        if answer.get("health_note"):
            _say(answer["health_note"])
        if answer.get("state") == "failed" and answer.get("log_tail"):
            _say(answer["log_tail"])
    sys.exit(exit_code(answer.get("state")))


@cli.command(help="Delete the host's old job dirs and unused bundles by its retention rule (also applied, at most "
                  "10 deletions, at every submit): a job dir goes once it is not among the newest --keep-jobs, "
                  "older than --keep-days, ended, owes no stop and holds no lock; only the jobs this controller "
                  "submitted (a login may serve several controllers) unless --all. HOST_OR_JOB: JOB.yaml (its host "
                  "section) or a host address. Exit: 0 · 2 · 3.")
@click.argument("host_or_job")
@click.option("--keep-jobs", type=click.IntRange(0), default=200, show_default=True, help="Newest job dirs kept.")
@click.option("--keep-days", type=click.FloatRange(0), default=14.0, show_default=True,
              help="Job dirs younger than this are kept.")
@click.option("--dry-run", is_flag=True, help="List what would go; delete nothing.")
@click.option("--all", "every", is_flag=True, help="Other controllers' jobs too (those this one did not submit).")
@click.option("--max-wait", type=click.FloatRange(0, MAX_WAIT_LIMIT_S), default=DEFAULT_MAX_WAIT_S, show_default=True,
              help="Seconds this call may take, plus one round trip (then exit 3).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def gc(host_or_job: str, keep_jobs: int, keep_days: float, dry_run: bool, every: bool, max_wait: float,
       as_json: bool) -> None:
    from ..commands import upkeep

    answer = upkeep.gc(host_or_job, keep_jobs=keep_jobs, keep_days=keep_days, dry_run=dry_run,
                           deadline=Deadline.for_command(max_wait), store=Store(), every=every)
    if as_json:
        _emit_json(answer)
        return
    verb = "would delete" if dry_run else "deleted"
    for kind, what in (("jobs", "job dir"), ("payloads", "payload bundle"), ("supervisors", "supervisor bundle")):
        for name in answer[kind]:
            _say(f"{verb} {what} {name}")
    for name in answer.get("others") or []:
        _say(f"kept job dir {name}: another controller's (--all deletes it too)")
    _say(f"{answer['host']}: {verb} {len(answer['jobs'])} job dirs, "
         f"{len(answer['payloads']) + len(answer['supervisors'])} bundles; kept {answer['kept']} job dirs")


def _restore_action(answer: dict) -> str:
    """What restore-service did: started the unit, or found it up."""
    if answer.get("started"):
        return f": started it (it was {answer.get('was') or 'not running'})"
    return ": it was up already (not started)"


def main(argv: list[str] | None = None) -> None:
    """The one place that turns errors into messages and exit codes."""
    try:
        cli.main(args=argv, prog_name="runner", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        _fail(argv, CODE_USAGE, exc.format_message(), _usage_hint(exc), EXIT_USAGE)
    except click.Abort as exc:  # click's word for a KeyboardInterrupt: ours (interrupts.py) says more
        said = exc.__cause__ if isinstance(exc.__cause__, Interrupted) else Interrupted("interrupted")
        _fail(argv, said.code, str(said), said.hint, said.exit_code)
    except RunnerError as exc:
        _fail(argv, exc.code, str(exc), exc.hint, exc.exit_code)
    except BrokenPipeError:
        sys.exit(EXIT_FAILED)
    sys.exit(EXIT_OK)


def _usage_hint(exc: click.ClickException) -> str:
    ctx = getattr(exc, "ctx", None)
    return f"`{ctx.command_path} --help` lists its arguments and options." if ctx is not None else ""


def _fail(argv: list[str] | None, error: str, message: str, hint: str, code: int) -> None:
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


cli.add_command(results_commands.results)
cli.add_command(results_commands.history)


@cli.command(help="Block until the job ends, printing its log as it comes (for CI; agents use `tail`). For a "
                  "fleet run: drive its rollout until every host is done or --timeout passes.\n\n"
                  "Exit codes: 0 SUCCEEDED · 1 ended otherwise · 75 still running at --timeout · 2 · 3")
@click.argument("job_id")
@click.option("--timeout", "timeout", default="30m", show_default=True, metavar="DURATION",
              help="Give up after this long (30s, 5m, 1h).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document at the end (the log still streams).")
def wait(job_id: str, timeout: str, as_json: bool) -> None:
    from ..commands import unattended
    from ..spec.spec_fields import parse_duration
    from . import fleet_cli

    try:
        seconds = parse_duration(timeout)
    except ValueError as exc:
        raise SpecError(f"--timeout: {exc}") from None
    if Store().is_run(job_id):
        sys.exit(fleet_cli.wait(job_id, max_wait=seconds, as_json=as_json))
    outcome = unattended.wait(job_id, store=Store(), out=sys.stdout.buffer, timeout=seconds, progress=_progress)
    if as_json:
        _emit_json(asdict(outcome))
    if not outcome.terminal:
        _progress(f"[runner] {job_id} still {outcome.state} after {timeout}; it keeps running on the host: "
                  f"`runner wait {job_id}` again goes on from here (`runner cancel {job_id}` stops it)")
    else:
        _progress(f"[runner] {job_id} ended {outcome.state}{render.exit_note(outcome.exit_code)}")
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
def mcp(jobs_dirs: tuple[str, ...], baselines_dirs: tuple[str, ...], allow_overrides: bool, allow_local: bool) -> None:
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
