"""`cancel`: ask the job's supervisor (or Slurm) to end the job."""
from __future__ import annotations

import os
import signal
import time

from ..contract import TERMINAL
from ..host.processes import is_alive
from ..supervision.files import append_line, is_slurm_job
from ..supervision.spec import job_paths
from .launcher import slurm_launch
from .reap import reap_if_dead


def cmd_cancel(args) -> dict:
    paths = job_paths(args)
    status = reap_if_dead(paths)
    if status["state"] in TERMINAL:
        return {"ok": True, "job_id": paths.job_id, "state": status["state"], "already": True}
    if is_slurm_job(paths):
        return slurm_launch().cancel(paths, status)
    with open(paths.cancel, "w") as fh:
        fh.write("%f\n" % time.time())
    supervisor = status.get("supervisor")
    if supervisor is not None and is_alive(supervisor):
        os.kill(int(supervisor["pid"]), signal.SIGUSR1)
    append_line(paths.events, {"t": time.time(), "event": "cancel-requested"})
    return {"ok": True, "job_id": paths.job_id, "state": status["state"], "already": False}
