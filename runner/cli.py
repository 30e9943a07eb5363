"""The `runner` command line. The only module that prints errors or exits: `main` for errors (each carries
its code, errors.py), `exit_code` for what a command found (a job's or a service's state).

Human output goes to stdout, progress and messages to stderr; `--json` prints one JSON document.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict

import click

from remote_payload.contract import STATES, is_terminal

from . import controller
from .errors import EXIT_ABORTED, EXIT_FAILED, EXIT_OK, EXIT_STILL_RUNNING, EXIT_USAGE, RunnerError, SpecError
from .store import Store

DEFAULT_MAX_WAIT = 50.0

EXIT_CODES_HELP = """\b
Exit codes:
  0   done / accepted / healthy
  1   the job ended other than SUCCEEDED, no result, or the service failed
  2   bad job spec or usage, unknown job id
  3   host unreachable, authentication failed, host key unknown or changed
  4   preflight refused (GPU memory, service policy, missing interpreter)
  5   host busy: another job holds the lock (the message names it)
  75  still running / still starting: call again
"""


def _progress(message: str) -> None:
    click.echo(message, err=True)


def _emit_json(obj) -> None:
    click.echo(json.dumps(obj, indent=1, sort_keys=True, default=str))


@click.group(help="Detached remote benchmark jobs over SSH that stop a GPU service, run, and bring it back.\n\n"
                  + EXIT_CODES_HELP)
@click.version_option(package_name="runner")
def cli() -> None:
    pass


@cli.command(help="Validate JOB.yaml, preflight the host, start the job detached; print its id.\n\n" + EXIT_CODES_HELP)
@click.argument("job_file")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a spec field, e.g. payload.args.experts=128.")
@click.option("--queue", is_flag=True, help="Wait on the host for a busy lock instead of refusing (exit 5).")
@click.option("--job-id", default=None, help="Choose the job id (makes a retried submit safe).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def submit(job_file: str, overrides: tuple[str, ...], queue: bool, job_id: str | None, as_json: bool) -> None:
    done = controller.submit(job_file, list(overrides), queue=queue, job_id=job_id, store=Store(), progress=_progress)
    if as_json:
        _emit_json(asdict(done))
    else:
        _progress(f"{'already submitted' if done.already else 'accepted'}: {done.state} on {done.host}; "
                  f"follow with `runner tail {done.job_id} -f`")
        click.echo(done.job_id)


@cli.command(help="Print the job's log bytes after the stored cursor (exactly once across calls).\n\n" + EXIT_CODES_HELP)
@click.argument("job_id")
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends or --max-wait passes.")
@click.option("--max-wait", type=click.FloatRange(0, 3600), default=DEFAULT_MAX_WAIT, show_default=True,
              help="Seconds this call may wait for new output (stay under your tool timeout).")
@click.option("--from-start", is_flag=True, help="Print from the first byte, not from the cursor.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (output decoded as UTF-8, lossy).")
def tail(job_id: str, follow: bool, max_wait: float, from_start: bool, as_json: bool) -> None:
    sink = _Capture() if as_json else sys.stdout.buffer
    outcome = controller.tail(job_id, store=Store(), out=sink, follow=follow, max_wait=max_wait, from_start=from_start)
    if as_json:
        _emit_json({**asdict(outcome), "output": sink.text()})
    elif not outcome.terminal:
        _progress(f"[runner] {job_id} still {outcome.state}; call again")
    else:
        _progress(f"[runner] {job_id} ended {outcome.state} (exit code {outcome.exit_code})")
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


@cli.command(help="State, phase, service and GPU state of one job (or all known jobs).\n\n" + EXIT_CODES_HELP)
@click.argument("job_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def status(job_id: str | None, as_json: bool) -> None:
    jobs = controller.status([job_id] if job_id else [], store=Store())
    if as_json:
        _emit_json(jobs[0] if job_id else jobs)
        return
    for job in jobs:
        click.echo(_status_line(job))


def _status_line(job: dict) -> str:
    service = job.get("service") or {}
    parts = [f"{job.get('job_id')}: {job.get('state')}"]
    if job.get("phase"):
        parts.append(f"({job['phase']})")
    if job.get("exit_code") is not None:
        parts.append(f"exit {job['exit_code']}")
    if service.get("unit"):
        parts.append(f"service {service['unit']} was {service.get('was')} now {service.get('now')}"
                     + (f" downtime {service['downtime_s']:.1f}s" if service.get("downtime_s") is not None else ""))
    if job.get("message"):
        parts.append(f"— {job['message']}")
    return " ".join(parts)


@cli.command(name="list", help="Jobs this controller knows (local index, no network).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def list_jobs(as_json: bool) -> None:
    records = Store().all()
    if as_json:
        _emit_json([asdict(r) for r in records])
        return
    for r in records:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.submitted_at))
        click.echo(f"{r.job_id}  {r.last_state:<10} {r.host['address']}  {when}  {r.name}")


@cli.command(help="Stop the job's payload (TERM, grace, KILL); the host then restores the service.\n\n" + EXIT_CODES_HELP)
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def cancel(job_id: str, as_json: bool) -> None:
    answer = controller.cancel(job_id, store=Store())
    if as_json:
        _emit_json(answer)
    else:
        _progress(f"cancel requested: {job_id} is {answer.get('state')}; follow with `runner tail {job_id} -f`")


@cli.command(help="Fetch the job's result.json: a table, or a lever plot with --plot.\n\n" + EXIT_CODES_HELP)
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print result.json as one JSON document.")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png", help="Write µs/token and lever vs batch size.")
def results(job_id: str, as_json: bool, plot_path: str | None) -> None:
    result = controller.result(job_id, store=Store())
    if as_json:
        _emit_json(result)
    else:
        click.echo(_render_result(result))
    if plot_path:
        from .results import plot_lever

        plot_lever(result, plot_path)
        _progress(f"wrote {plot_path}")


def _render_result(result: dict) -> str:
    from .results import render_any

    return render_any(result)


@cli.command(name="restore-service",
             help="Start the service if inactive and wait until healthy; idempotent.\n\n"
                  "Give JOB.yaml, or --host and --unit.\n\n" + EXIT_CODES_HELP)
@click.argument("job_file", required=False)
@click.option("--host", "address", default=None, help="ssh_config alias or hostname ('local' for this machine).")
@click.option("--user", default=None)
@click.option("--port", type=int, default=None)
@click.option("--unit", default=None, help="systemd unit name.")
@click.option("--scope", type=click.Choice(["system", "user"]), default="system", show_default=True)
@click.option("--sudo", is_flag=True, help="Run systemctl through `sudo -n`.")
@click.option("--health-url", default=None)
@click.option("--host-key-policy", type=click.Choice(["strict", "accept-new"]), default="strict", show_default=True)
@click.option("--max-wait", type=click.FloatRange(0, 3600), default=DEFAULT_MAX_WAIT, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def restore_service(job_file, address, user, port, unit, scope, sudo, health_url, host_key_policy, max_wait, as_json) -> None:
    host, service = _restore_target(job_file, address, user, port, unit, scope, sudo, health_url, host_key_policy)
    answer = controller.restore_service(host, service, max_wait=max_wait)
    if as_json:
        _emit_json(answer)
    else:
        click.echo(f"{service['unit']}: {answer.get('state')} ({answer.get('active_state')}/{answer.get('sub_state')})")
        if answer.get("state") == "failed" and answer.get("log_tail"):
            click.echo(answer["log_tail"])
    sys.exit(exit_code(answer.get("state")))


def _restore_target(job_file, address, user, port, unit, scope, sudo, health_url, host_key_policy):
    if job_file and (address or unit):
        raise SpecError("give either JOB.yaml or --host/--unit, not both")
    if job_file:
        return controller.restore_target(job_file, [])
    if not (address and unit):
        raise SpecError("restore-service needs JOB.yaml, or both --host and --unit")
    from .spec import HostSpec, ServiceSpec
    from .spec_load import section_from_options

    host = section_from_options(HostSpec, "--host", address=address, user=user, port=port,
                                host_key_policy=host_key_policy)
    service = section_from_options(ServiceSpec, "--unit", manager="systemd", unit=unit, scope=scope, sudo=sudo,
                                   health_url=health_url)
    return host.model_dump(), service.model_dump()


def exit_code(state: str | None, *, settled: bool = True) -> int:
    """The exit status for what a command found: a job state, or a restore's service state (healthy/starting/
    failed). settled=False: there is more to come (tail has output left to print), so "call again"."""
    if not settled or state == "starting" or (state in STATES and not is_terminal(state)):
        return EXIT_STILL_RUNNING
    return EXIT_OK if state in ("SUCCEEDED", "healthy") else EXIT_FAILED


def main(argv: list[str] | None = None) -> None:
    """The one place that turns errors into messages and exit codes."""
    try:
        cli.main(args=argv, prog_name="runner", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USAGE)
    except click.Abort:
        click.echo("aborted", err=True)
        sys.exit(EXIT_ABORTED)
    except RunnerError as exc:
        click.echo(f"runner: error: {exc}", err=True)
        if exc.hint:
            click.echo(f"runner: hint: {exc.hint}", err=True)
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        sys.exit(EXIT_FAILED)
    sys.exit(EXIT_OK)
