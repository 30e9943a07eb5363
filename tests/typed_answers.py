"""Front-end text from an answer as `--json` prints it (a dict): typed as HostClient types it, then rendered."""
from __future__ import annotations

from runner.commands.render import job_text
from runner.remote.job_answers import JobStatus


def status_text(job: dict) -> str:
    """`runner status`'s block of one job."""
    return job_text(JobStatus.from_json(job))
