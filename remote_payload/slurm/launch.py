"""`launcher: slurm` on the host side: submit with sbatch, run inside the allocation, follow Slurm's view.

One writer per file, so no update is lost: status.json, events.jsonl and output.log are the supervisor's in the
allocation; slurm.json (Slurm's job id, its last answer, when it was asked) is the login node's. The login node
writes status.json only for a job Slurm ended while the supervisor could not (still waiting, or a dead node);
then nobody else writes it any more.

Slurm is asked at most every SLURM_POLL_S per job (slurm.json caches its answer), so `logs --wait` and many
`status` callers do not load slurmctld.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import asdict

from ..contract import TERMINAL
from ..host.answer import Fail
from ..host.bundle import SUPERVISOR
from ..supervision.budget import recorded
from ..supervision.files import JobPaths, append_line, read_json, read_status, write_json_atomic
from ..supervision.record import Job
from . import array as slurm_array
from .allocation import run_job
from .batch import batch_script, parse_sbatch_parsable, sbatch_argv
from .calls import SLURM_POLL_S, raise_if_unreachable, scancel_if_late, slurm_call, slurm_file
from .states import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    SlurmJob,
    SlurmOutputError,
    forgotten,
    parse_sacct,
    parse_squeue,
    reconcile,
    sacct_disabled,
    squeue_forgot,
)

SBATCH_TIMEOUT_S = 30.0
TOOLS = ("sbatch", "squeue", "scancel")


# ── the login node ────────────────────────────────────────────────────────────────────────────────────

def preflight(python: str) -> dict:
    """The login node can submit: sbatch, squeue and scancel are there and slurmctld answers."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise Fail("slurm-unavailable", "%s not found on the login node's PATH (%s)"
                   % (", ".join(missing), os.environ.get("PATH", "")))
    done = slurm_call(["sinfo", "-h", "-o", "%P"])
    raise_if_unreachable(done, "sinfo")
    return {"ok": True, "service": None, "locks": [], "python": python, "gpus": [], "apps": [],
            "nvidia_smi": shutil.which("nvidia-smi") is not None,
            "slurm": {"partitions": done.stdout.split()}}


def submit(paths: JobPaths, spec: dict) -> dict:
    """sbatch the claimed job dir's job (a sweep: one job array); a refusal removes the dir and says why."""
    array = array_shape(spec)
    try:
        argv = submit_argv(paths, spec)
    except ValueError as exc:
        shutil.rmtree(paths.dir, ignore_errors=True)
        raise Fail("bad-spec", str(exc)) from exc
    except Fail:  # its status.json unreadable just after the claim: nothing was submitted
        shutil.rmtree(paths.dir, ignore_errors=True)
        raise
    script = batch_script(sys.executable, SUPERVISOR, paths.root, paths.job_id)
    try:
        done = slurm_call(argv, stdin=script, timeout=SBATCH_TIMEOUT_S)
        raise_if_unreachable(done, "sbatch")
        if done.returncode != 0:
            raise Fail("slurm-refused", done.stderr.strip()[-2000:] or "sbatch exited %d" % done.returncode)
        slurm_job_id = parse_sbatch_parsable(done.stdout)
    except (Fail, ValueError):
        shutil.rmtree(paths.dir, ignore_errors=True)
        raise
    known = {"job_id": slurm_job_id, "submitted_at": time.time()}
    if array:
        known["array"] = {"variants": array[0], "max_parallel": array[1]}
    write_json_atomic(slurm_file(paths), known)
    append_line(paths.events, {"t": time.time(), "event": "slurm-submitted", "slurm_job_id": slurm_job_id})
    return {"ok": True, "job_id": paths.job_id, "state": "QUEUED", "slurm_job_id": slurm_job_id,
            "job_dir": paths.dir}


def submit_argv(paths: JobPaths, spec: dict) -> list:
    """sbatch's argv for the claimed job: its --time is the job's recorded budget (slurm_time_min)."""
    minutes = recorded(spec, read_status(paths))["slurm_time_min"]
    return sbatch_argv(spec["slurm"], paths.job_id, paths.dir, minutes, array=array_shape(spec))


def array_shape(spec: dict):
    """(variants, max_parallel) for a sweep's job array, None for a single job."""
    sweep = spec.get("sweep")
    return (len(sweep["variants"]), sweep["max_parallel"]) if sweep else None


def refresh(paths: JobPaths) -> dict:
    """status.json with Slurm's view; a job Slurm ended while its supervisor could not write is ended here."""
    status = read_status(paths)
    known = _read_known(paths)
    if known is None:  # sbatch has not answered yet
        return status
    if known.get("array"):  # a sweep: one task per variant, each reconciled as one job
        return slurm_array.refresh(paths, known)
    if status["state"] not in TERMINAL:
        known = _asked(paths, known)
        status = read_status(paths)  # again, after Slurm's answer: a supervisor that just finished wins
        view = _view(known)
        state, message = reconcile(status["state"], status.get("supervisor") is not None, view)
        if state in TERMINAL and state != status["state"]:
            status = _record_end(paths, state, message)
        elif message:
            status = dict(status, message=message)
        _escalate_cancel(paths, status, known)
    return _with_view(status, known)


def cancel(paths: JobPaths, status: dict) -> dict:
    """Cancel file first (the supervisor checks it), then Slurm: a job still waiting is scancelled and marked
    CANCELLED here; a running one gets SIGUSR1 in its batch step and its supervisor writes CANCELLED."""
    with open(paths.cancel, "w") as fh:
        fh.write("%f\n" % time.time())
    append_line(paths.events, {"t": time.time(), "event": "cancel-requested"})
    known = _read_known(paths)
    answer = {"ok": True, "job_id": paths.job_id, "already": False}
    if known is None:
        return dict(answer, state=status["state"])
    if known.get("array"):
        return dict(answer, **slurm_array.cancel(paths, known))
    started = status.get("supervisor") is not None
    argv = ["scancel", "--batch", "--signal=USR1", known["job_id"]] if started else ["scancel", known["job_id"]]
    done = slurm_call(argv)
    if done.returncode != 0:
        answer["scancel"] = done.stderr.strip()[-500:]
    if not started:
        job = Job.load(paths)
        if not job.terminal and job.status.get("supervisor") is None:
            job.set_state("CANCELLED", "done", message="cancelled while waiting in Slurm's queue",
                          ended_at=time.time(), restored=True)
        status = job.status
    return dict(answer, state=status["state"], slurm_job_id=known["job_id"])


def log_chunk(paths: JobPaths, offset: int, limit: int):
    """A job array's log: its variants' logs in turn (slurm_array.combined_chunk); None for one job."""
    if not read_json(paths.spec).get("sweep"):
        return None
    return slurm_array.log_chunk(paths, offset, limit)


def _read_known(paths: JobPaths):
    try:
        return read_json(slurm_file(paths))
    except (OSError, ValueError):
        return None


def _asked(paths: JobPaths, known: dict) -> dict:
    """slurm.json with a view of the job at most SLURM_POLL_S old (asking Slurm when it is older)."""
    if time.time() - known.get("asked_at", 0) < SLURM_POLL_S:
        return known
    view, error = ask(known["job_id"])
    known = dict(known, asked_at=time.time(), view=asdict(view) if view else None, error=error)
    write_json_atomic(slurm_file(paths), known)
    return known


def ask(slurm_job_id: str) -> tuple:
    """(SlurmJob or None, error or None): squeue first, sacct once slurmctld forgot it, else `forgotten`."""
    done = slurm_call(["squeue", "-h", "-t", "all", "-j", slurm_job_id, "-o", SQUEUE_FORMAT])
    try:
        if done.returncode == 0:
            found = parse_squeue(done.stdout).get(slurm_job_id)
            if found is not None:
                return found, None
        elif not squeue_forgot(done.returncode, done.stderr):
            return None, "squeue: " + (done.stderr.strip()[-300:] or "exit %d" % done.returncode)
        done = slurm_call(["sacct", "-n", "-P", "-X", "-j", slurm_job_id, "-o", SACCT_FIELDS])
        if sacct_disabled(done.returncode, done.stderr):
            return forgotten(slurm_job_id, done.stderr.strip()[-300:]), None
        if done.returncode != 0:
            return None, "sacct: " + (done.stderr.strip()[-300:] or "exit %d" % done.returncode)
        return parse_sacct(done.stdout).get(slurm_job_id) or forgotten(slurm_job_id, "no record of it"), None
    except SlurmOutputError as exc:
        return None, str(exc)


def _view(known: dict):
    return SlurmJob(**known["view"]) if known.get("view") else None


def _record_end(paths: JobPaths, state: str, message: str) -> dict:
    job = Job.load(paths)
    if not job.terminal:
        job.set_state(state, "done", message=message, ended_at=time.time(), restored=True)
    return job.status


def _escalate_cancel(paths: JobPaths, status: dict, known: dict) -> None:
    view = _view(known)
    if (status["state"] in TERMINAL or known.get("scancel_at") or not os.path.exists(paths.cancel)
            or view is None or view.state in TERMINAL):
        return
    scancel_if_late(paths, known, read_json(paths.spec)["limits"]["grace"])


def _with_view(status: dict, known: dict) -> dict:
    view = _view(known)
    allocation = status.get("slurm") or {}  # what slurm-run recorded in the allocation
    return dict(status, slurm={"job_id": known["job_id"], "state": view.slurm_state if view else None,
                               "reason": view.reason if view else None, "node": allocation.get("node"),
                               "cuda_visible_devices": allocation.get("cuda_visible_devices"),
                               "error": known.get("error")})


# ── the allocation ────────────────────────────────────────────────────────────────────────────────────

def run_in_allocation(root: str, job_id: str) -> dict:
    """`slurm-run`: the batch script's process; `exit_status` becomes its exit code, so Slurm's accounting
    shows the payload's. In a job array's task: that task's variant."""
    paths = JobPaths(root, job_id)
    if read_json(paths.spec).get("sweep"):
        return slurm_array.run_task(paths)
    job = Job.load(paths)
    if job.terminal:  # cancelled while it waited, and Slurm started it anyway
        return {"ok": True, "state": job.status["state"], "exit_status": 0}
    return run_job(job)
