"""The Slurm launcher (slurm/launch.py) imported on first use: only Slurm jobs need it and its imports
(dataclasses, typing); `slurm-run` in an allocation."""
from __future__ import annotations

from ..supervision.spec import check_job_id


def slurm_launch():
    from ..slurm import launch as module
    return module


def cmd_slurm_run(args) -> dict:
    """The batch script's process in a Slurm allocation."""
    return slurm_launch().run_in_allocation(args.root, check_job_id(args.job_id))
