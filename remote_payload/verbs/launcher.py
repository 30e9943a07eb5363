"""The Slurm launcher (slurm/launch.py), imported on first use: only Slurm jobs need it, and its imports
(dataclasses, typing) were a third of every call's start-up on the host; `slurm-run` in an allocation."""
from __future__ import annotations

from ..supervision.spec import check_job_id


def slurm_launch():
    """remote_payload/slurm/launch.py, imported on first use: only Slurm jobs need it, and its imports
    (dataclasses, typing) were a third of every call's start-up on the host."""
    from ..slurm import launch as module
    return module


def cmd_slurm_run(args) -> dict:
    """The batch script's process in a Slurm allocation (remote_payload/slurm/launch.py)."""
    return slurm_launch().run_in_allocation(args.root, check_job_id(args.job_id))
