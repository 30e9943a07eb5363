"""`start`: claim the job id, then hand the job to Slurm or to its own detached supervisor (supervision/run.py)."""
from __future__ import annotations

from ..supervision.files import JobPaths
from ..supervision.run import launch_detached
from ..supervision.spec import check_job_id, read_spec_stdin
from ..supervision.start import claim_job_dir
from .launcher import slurm_launch


def cmd_start(args) -> dict:
    return start_job(args, read_spec_stdin(args.root, check_job_id(args.job_id)))


def start_job(args, spec: dict) -> dict:
    paths = JobPaths(args.root, check_job_id(args.job_id))
    claim_job_dir(paths, spec, args.queue)
    if spec.get("launcher") == "slurm":  # Slurm queues it: no lock, no --queue, no detached supervisor here
        return slurm_launch().submit(paths, spec)
    return launch_detached(paths, spec, args.queue)
