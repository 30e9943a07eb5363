"""An id as both front ends take it: a fleet run of this controller (RUN, what `submit` of a spec with a list of
hosts printed) or one job, resolved once; each function returns an Outcome, the JSON document `runner … --json`
prints and the exit code, and the CLI (cli.py, fleet_cli.py) and the MCP server only render it. So `runner
status RUN` and MCP `status` of RUN say the same states per host and the same exit code.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

from ..commands import controller
from ..deadline import Deadline
from ..errors import EXIT_OK, UnknownJob, exit_code, exit_for, worst
from ..remote.job_answers import JobStatus
from ..state.store import Store, is_over

if TYPE_CHECKING:
    from ..commands.plan import Plan
    from ..state.fleet_store import RunRecord

# The rollout's modules (fleet, fleet_view) and the run store (fleet_store) are imported by the functions of a
# run: a job's status or cancel never loads them (`Store.is_run` tells a run's id from a job's).


@dataclass
class Outcome:
    document: Any        # what `--json` prints
    exit: int            # the CLI's exit code
    of_run: bool = False  # the id named a fleet run (else one job, or every job)
    run: RunRecord | None = None  # a run's record, for its text
    detail: Any = None   # what the text is drawn from: a run's rows, its results, a job's statuses


def run_outcome(run: RunRecord) -> Outcome:
    """A run as submit and wait report it: 0 every host's job SUCCEEDED · 1 over, some host did not · 75 hosts
    still to go."""
    from . import fleet_view

    return Outcome({**asdict(run), "state": run.state, "finished": run.finished},
                   fleet_view.state_exit(run.state if run.finished else None), True, run)


def submit_fleet(plan: Plan, *, run_id: str | None, queue: bool, store: Store, max_wait: float,
                 progress: Callable[[str], None], forks: int | None = None) -> Outcome:
    """A fleet's run from the command's plan, its rollout driven for up to max_wait."""
    from . import fleet

    return run_outcome(fleet.submit(plan.spec_path, list(plan.overrides), run_id=run_id, queue=queue, store=store,
                                    max_wait=max_wait, progress=progress, forks=forks, planned=plan))


def status(ref: str | None, *, store: Store, deadline: Deadline, every: bool = False) -> Outcome:
    """A run's hosts (each its phase and its job's live status; the worst exit wins), or one job's status (one its
    host does not know is an unknown job, exit 2), or the recent and unfinished jobs' (every known job's with
    `every`), whose exit is that of the jobs still running: a job that ended badly once is history, not this
    call's outcome."""
    if ref and store.is_run(ref):
        from . import fleet_view

        run, rows = fleet_view.status(ref, store=store, deadline=deadline)
        return Outcome({"run_id": run.run_id, "state": run.state, "max_unavailable": run.max_unavailable,
                        "hosts": [row.to_json() for row in rows]}, worst(row.exit for row in rows), True, run, rows)
    jobs = controller.status([ref] if ref else [], store=store, deadline=deadline, every=every)
    if ref and jobs and jobs[0].state == "UNKNOWN":
        raise UnknownJob(f"job {ref} is not on its host (it was never started there, or its directory was removed)")
    counted = jobs if ref else [job for job in jobs if not is_over(job.state)]  # every job: by those still running
    return Outcome(jobs[0].raw if ref else [job.raw for job in jobs], worst(_job_exit(job) for job in counted),
                   detail=jobs)


def _job_exit(job: JobStatus) -> int:
    """A job's exit status in `status`: its state's, or its host's error's (3: unreachable, a refused host key or
    login, a bad answer) when its host could not be asked: never "call again" for a host that refuses."""
    return exit_for(job.error) if job.error else exit_code(job.state)


def cancel(ref: str, *, store: Store, deadline: Deadline) -> Outcome:
    """A run: every host's answer (or its error), the worst exit; one job: its host's answer, 0."""
    if store.is_run(ref):
        from . import fleet

        answers = fleet.cancel(ref, store=store, deadline=deadline)
        return Outcome(answers, max((a.get("exit", EXIT_OK) for a in answers.values()), default=EXIT_OK), True)
    return Outcome(controller.cancel(ref, store=store, deadline=deadline), EXIT_OK)


def run_results(run_id: str, *, store: Store, deadline: Deadline) -> Outcome:
    """Every host's result.json, and why a host has none: 0 all there · 1 some missing."""
    from . import fleet_view

    found = fleet_view.results(run_id, store=store, deadline=deadline)
    return Outcome({"results": found.results, "missing": found.missing},
                   EXIT_OK if found.results and not found.missing else 1, True, detail=found)


def run_tail(run_id: str, *, store: Store, out: BinaryIO, follow: bool, max_wait: float, from_start: bool,
             progress: Callable[[str], None]) -> Outcome:
    """Every started host's new log to `out`, each line prefixed `[HOST] ` (fleet_view.tail); per host the
    exit code of what it found, the worst wins."""
    from . import fleet_view

    run, codes = fleet_view.tail(run_id, store=store, out=out, follow=follow, max_wait=max_wait,
                                 from_start=from_start, progress=progress)
    return Outcome({"hosts": codes}, worst(codes.values()), True, run)
