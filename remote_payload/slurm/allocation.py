"""A Slurm allocation's run of one job (or of one job array task's variant): the job's usual choreography
(supervisor_job.supervise) without locks, service or guard, Slurm owning the node and its GPUs; the
allocation's GPU memory checked first; its exit status the batch script's.
"""
from __future__ import annotations

import os
import signal
import time

from ..contract import memory_verdict
from ..host.answer import Fail
from ..host.gpu import GPU_QUERY, nvidia_smi
from ..host.parsers import parse_gpu_csv
from ..host.processes import identity
from ..supervision.job import Flags, Job, supervise
from ..supervision.locks import Locks


def run_job(job: Job) -> dict:
    """The job (or one array task's variant) in this allocation, to its final state."""
    paths = job.paths
    flags = Flags()
    _install_handlers(flags)
    env = os.environ
    allocation = {"job_id": env.get("SLURM_JOB_ID"), "node": env.get("SLURMD_NODENAME"),
                  "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES")}
    job.save(supervisor=identity(os.getpid()), slurm=allocation)
    job.event("slurm-allocation", **allocation)
    problem = gpu_memory_problem(job)
    if problem:
        job.set_state("FAILED", "done", message=problem, ended_at=time.time(), restored=True)
        return {"ok": True, "state": "FAILED", "exit_status": 1}
    locks = Locks(paths.root, [], paths.job_id)  # none: Slurm gives this allocation its GPUs alone
    locks.try_acquire()
    supervise(job, locks, flags)  # Slurm's TERM ends it CANCELLED, named so (supervisor_payload.check_interrupt)
    return {"ok": True, "state": job.status["state"], "exit_status": exit_status(job.status)}


def _install_handlers(flags: Flags) -> None:
    """Slurm's SIGTERM (scancel, its time limit) and our SIGUSR1 (`cancel`) both stop the payload as a cancel."""
    def cancel(signum, frame):
        flags.cancel = True
        flags.slurm_term = flags.slurm_term or signum == signal.SIGTERM

    def stop(signum, frame):
        flags.signal = signum

    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, cancel)
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)


def gpu_memory_problem(job: Job):
    """None, or why the allocation's GPUs cannot hold gpu.required_mib (read with nvidia-smi, here)."""
    need = job.spec["gpu"]["required_mib"]
    if not need:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return ("the job needs %d MiB of GPU memory but its Slurm allocation has no GPU (ask with slurm.gres "
                "or slurm.gpus)" % need)
    try:
        gpus = parse_gpu_csv(nvidia_smi(GPU_QUERY))
    except (Fail, ValueError) as exc:
        return "cannot check GPU memory in the Slurm allocation: %s" % exc
    ids = (os.environ.get("SLURM_JOB_GPUS") or visible).split(",")
    mine = [g for g in gpus if g["index"] in ids or g["uuid"] in ids] or gpus  # a cgroup shows only ours
    job.save(gpu=dict(job.status["gpu"], before=mine))
    short = [g for g in mine if memory_verdict(g, need) != "ok"]
    if not short:
        return None
    return "GPU memory is short in the Slurm allocation on %s: %s" % (os.environ.get("SLURMD_NODENAME", "?"), "; ".join(
        "GPU %s has %s MiB free of %s MiB, %d MiB needed" % (g["index"], g["free_mib"], g["total_mib"], need)
        for g in short))


def exit_status(status: dict) -> int:
    """The batch script's exit code: 0 only for SUCCEEDED, else the payload's code (1 when it has none)."""
    if status["state"] == "SUCCEEDED":
        return 0
    code = status.get("exit_code")
    return code if isinstance(code, int) and 0 < code < 256 else 1
