"""What the front ends share: each function resolves its target once and returns plain data or raises from the
one error tree; the CLI (cli.py) and the MCP server (mcp_server.py) only render what comes back, so the two
give the same answer for the same case.

May import: controller, store, errors (never cli or mcp_server).
"""
from __future__ import annotations

from ..deadline import Deadline
from ..errors import UnknownJob, exit_code, exit_for
from ..remote.job_answers import JobStatus
from ..state.store import Store
from . import controller


def job_statuses(job_id: str | None, *, store: Store, deadline: Deadline,
                 every: bool = False) -> list[JobStatus]:
    """One job's status, or the recent and unfinished jobs' (every known job's with `every`); a job its host
    does not know is an unknown job (exit 2)."""
    jobs = controller.status([job_id] if job_id else [], store=store, deadline=deadline, every=every)
    if job_id and jobs and jobs[0].state == "UNKNOWN":
        raise UnknownJob(f"job {job_id} is not on its host (it was never started there, or its directory was removed)")
    return jobs


def job_exit(job: JobStatus) -> int:
    """A job's exit status in `status`: its state's, or its host's error's (3: unreachable, a refused host key or
    login, a bad answer) when its host could not be asked: never "call again" for a host that refuses."""
    return exit_for(job.error) if job.error else exit_code(job.state)
