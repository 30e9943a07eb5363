"""A job's status as the host believes it. NOT read-only: a job whose supervisor and guard are both gone is
marked LOST and a detached restorer is started; a terminal status the ledger contradicts is not believed."""
from __future__ import annotations

import time

from ..contract import TERMINAL
from ..host.answer import Fail
from ..host.bundle import RUN_SUPERVISOR
from ..supervision.files import JobPaths, is_slurm_job, read_status
from ..supervision.restore import owed
from .launcher import slurm_launch

START_GRACE_S = 60.0         # a status with no supervisor recorded yet is "starting" this long


def reap_if_dead(paths: JobPaths) -> dict:
    """status.json, a job whose supervisor and guard are both gone marked LOST and a restorer started."""
    if is_slurm_job(paths):  # its supervisor runs on a compute node: Slurm says if it lives
        return slurm_launch().refresh(paths)
    try:
        status = read_status(paths)
    except Fail:
        restore_if_owed(paths, owed.stops_owed(paths.root, paths.job_id))  # the ledger says whether a stop is owed
        raise
    if status["state"] in TERMINAL:
        return believed(paths, status)
    entries = owed.stops_owed(paths.root, paths.job_id)
    if owed.job_alive(paths.root, paths.job_id, status, entries):
        return status
    if not entries and status.get("supervisor") is None and time.time() - status.get("created_at", 0) < START_GRACE_S:
        return status  # `start` is still bringing the supervisor up (a job the ledger names has stopped a unit)
    from ..supervision.record import Job  # a reap's alone: a live or ended job's status never loads it

    job = Job.load(paths)  # re-read: with both gone nobody writes any more, so this is the last word
    if job.terminal:
        return job.status
    job.set_state("LOST", "supervisor and guard are gone", message="the supervisor and its guard died; "
                  "a restore was started", ending=job.status.get("ending"), ended_at=time.time())
    restore_detached(paths)
    return job.status


def believed(paths: JobPaths, status: dict) -> dict:
    """A terminal status, unless the host ledger says the job still owes a restore (the payload can overwrite
    status.json): then it is running while its supervisor or guard holds its locks, else LOST and restored."""
    entries = owed.stops_owed(paths.root, paths.job_id)
    why = owed.contradiction(status, entries)
    if why is None:
        return status
    if owed.holds_locks(paths.root, paths.job_id, entries):
        return dict(status, state="RUNNING", phase=why + ": not believed while the job runs", restored=False)
    job = owed.load_for_restore(paths)
    job.set_state("LOST", job.status["phase"], message=job.status["message"], ended_at=job.status["ended_at"])
    restore_if_owed(paths, entries)
    return job.status


def restore_if_owed(paths: JobPaths, entries: list) -> None:
    """Start a detached `restore` when the ledger names a stop of this job and nobody of the job is alive."""
    if entries and not owed.holds_locks(paths.root, paths.job_id, entries):
        restore_detached(paths)


def restore_detached(paths: JobPaths) -> None:
    """`supervisor.py restore` of the job, detached (its start room imported here: a reap is rare)."""
    from ..supervision.start import daemonize_exec

    daemonize_exec(RUN_SUPERVISOR + ["restore", "--job-id", paths.job_id, "--root", paths.root], paths.restore_log)
