"""The `runner` commands on a fleet run (RUN = the id `runner submit` printed for a spec with a list of hosts):
cli.py calls them for a fleet or a run's id; each prints what fleet/targets.py found and returns the exit code
for cli.py to exit with (errors still go through cli.main).
"""
from __future__ import annotations

import sys

from ..commands import controller
from ..commands.plan import Plan
from ..deadline import Deadline
from ..errors import EXIT_OK, first_line
from ..fleet import fleet, fleet_view, targets
from ..fleet.fleet import for_each_host
from ..state.fleet_store import HostEntry, RunRecord
from ..state.store import Store
from .cli_echo import emit_json as _emit_json
from .cli_echo import progress as _progress
from .cli_echo import say as _say


def run_text(run: RunRecord) -> str:
    width = max(len(e.address) for e in run.hosts)
    lines = [f"{run.run_id}: {run.state} ({sum(e.final for e in run.hosts)} of {len(run.hosts)} hosts final, "
             f"max_unavailable {run.max_unavailable}, forks {run.forks})"]
    lines += [f"  {e.address:<{width}}  {e.job_id}  {e.phase}" + (f" {e.state}" if e.state else "")
              + (f"  {e.note}" if e.note else "") for e in run.hosts]
    return "\n".join(lines)


def submit(plan: Plan, *, run_id: str | None, queue: bool, dry_run: bool, max_wait: float, as_json: bool,
           forks: int | None = None) -> int:
    """A fleet's submit from the command's plan (validated once, for every host)."""
    if dry_run:
        return _dry_run(plan, queue=queue, deadline=Deadline.for_command(max_wait))
    return _report(targets.submit_fleet(plan, run_id=run_id, queue=queue, store=Store(), max_wait=max_wait,
                                        progress=_progress, forks=forks), as_json)


def wait(run_id: str, *, max_wait: float, as_json: bool) -> int:
    return _report(targets.run_outcome(fleet.drive(run_id, store=Store(), max_wait=max_wait, progress=_progress)),
                   as_json)


def _report(outcome: targets.Outcome, as_json: bool) -> int:
    run = outcome.run
    assert run is not None  # submit and wait report a fleet run (targets.run_outcome)
    if as_json:
        _emit_json(outcome.document)
    else:
        _say(run.run_id)
        _progress(run_text(run))
        if not run.finished:
            _progress(f"[runner] run {run.run_id} unfinished; drive it on with `runner wait {run.run_id} "
                      f"--timeout 100s` (exit 75 while unfinished)")
    return outcome.exit


def _dry_run(plan: Plan, *, queue: bool, deadline: Deadline) -> int:
    """Every host's dry run at once, from the one plan: what it would do, or why it would be skipped.
    Nothing is changed."""
    entries = [HostEntry(a, "") for a in plan.addresses]
    plans, errors = for_each_host(entries, lambda e: controller.dry_run(
        plan.spec_path, list(plan.overrides), queue=queue, planned=plan.for_address(e.address),
        deadline=deadline))
    _say(f"dry run of a fleet of {len(entries)}: nothing was started or changed")
    for entry in entries:
        would = plans.get(entry.address)
        if would is None:
            _say(f"  {entry.address}: WOULD BE SKIPPED: {first_line(errors[entry.address])}")
        else:
            service = (would.service or {}).get("unit")
            _say(f"  {entry.address}: {would.required_mib} MiB needed; "
                 + (f"{service} WOULD BE STOPPED (counts against max_unavailable)" if would.stop_service
                    else "the service is left running"))
    return EXIT_OK


def status(found: targets.Outcome, *, as_json: bool) -> int:
    """`runner status RUN` as targets.status found it."""
    if as_json:
        _emit_json(found.document)
    else:
        assert found.run is not None  # the outcome of a fleet run's id (of_run)
        _say(fleet_view.status_text(found.run, found.detail))
    return found.exit


def tail(run_id: str, *, follow: bool, max_wait: float, from_start: bool) -> int:
    found = targets.run_tail(run_id, store=Store(), out=sys.stdout.buffer, follow=follow, max_wait=max_wait,
                             from_start=from_start, progress=_progress)
    _progress(f"[runner] {run_id}: " + ", ".join(f"{a} {_word(c)}" for a, c in found.document["hosts"].items()))
    return found.exit


def _word(code: int) -> str:
    return {0: "succeeded", 1: "ended otherwise", 3: "unreachable", 75: "still running"}.get(code, str(code))


def cancel(found: targets.Outcome, *, as_json: bool) -> int:
    """`runner cancel RUN` as targets.cancel found it: per host its answer."""
    if as_json:
        _emit_json(found.document)
    for address, answer in found.document.items():
        if not as_json:
            what = (f"error: {answer['error']}" if "error" in answer else
                    f"already {answer.get('state')}" if answer.get("already") else
                    f"cancel requested ({answer.get('state')})")
            _progress(f"{address}: {what}")
    return found.exit


def results(run_id: str, *, as_json: bool, plot_path: str | None, deadline: Deadline) -> int:
    from ..results.fleet_results import plot_hosts, side_by_side

    found = targets.run_results(run_id, store=Store(), deadline=deadline)
    if as_json:
        _emit_json(found.document)
    else:
        _say(side_by_side(found.detail.results, found.detail.missing), nl=False)
    if plot_path:
        plot_hosts(found.detail.results, plot_path)
        _progress(f"wrote {plot_path}")
    return found.exit
