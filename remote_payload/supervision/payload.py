"""The payload's process, for every way it runs (its prepare step, staged, a sweep's variants): its argv and
environment, the launch in its own process group with output to the log, cancel and signals, and the record
of how it exited.
"""
from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time

from ..host.answer import Fail
from ..host.processes import POLL_S, identity
from . import ledger, services
from .record import Flags, Interrupted, Job, signal_name

SIGNAL_SETTLE_S = 2.0  # a payload's death by a signal waits this long for the same signal to reach the supervisor


def check_interrupt(job: Job, flags: Flags) -> None:
    if flags.signal is not None:
        name = signal_name(flags.signal)
        raise Interrupted("FAILED", "the supervisor got %s; the payload was stopped and the service restored" % name)
    if flags.cancel or os.path.exists(job.paths.cancel):
        if flags.slurm_term and not os.path.exists(job.paths.cancel):
            raise Interrupted("CANCELLED", "Slurm sent SIGTERM (scancel outside runner, preemption or Slurm's "
                                           "time limit)")
        raise Interrupted("CANCELLED", "cancelled on request")


def interrupt_of(job: Job, flags: Flags):
    """(state, message) of a cancel or a signal to the supervisor (check_interrupt's), or None."""
    try:
        check_interrupt(job, flags)
    except Interrupted as stop:
        return stop.state, str(stop)
    return None


def interrupt_after_exit(job: Job, flags: Flags, returncode: int):
    """interrupt_of once a payload exited. A signal that killed it may have been sent to every process of the
    step or session (Slurm's TERM reaches each in turn), the supervisor's own still on its way: a death by a
    signal waits up to SIGNAL_SETTLE_S for it, so a scancel is not taken for the payload's failure."""
    settle_until = time.monotonic() + (SIGNAL_SETTLE_S if returncode < 0 else 0.0)
    while True:
        stop = interrupt_of(job, flags)
        if stop is not None or time.monotonic() >= settle_until:
            return stop
        time.sleep(POLL_S)


def payload_argv(spec: dict, args=None) -> list:
    """A run's argv; args: a command payload's whole command, a script's arguments (default: the payload's)."""
    payload = spec["payload"]
    if payload["command"] is not None:
        return list(payload["command"] if args is None else args)
    return [payload["python"], payload["path"]] + list(payload["args"] if args is None else args)


def payload_env(job: Job, result=None, staged: bool = False, slot=None, user=None) -> dict:
    """slot: (index, devices) of a sweep's variant: its own devices, and RUNNER_GPU_SLOT naming the slot.
    user: payload.user's pwd entry (its HOME, USER and LOGNAME), or None."""
    env = dict(os.environ)
    env.pop("RUNNER_STAGED", None)  # set only for a staged payload's launch, never inherited
    if user is not None:
        env.update({"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name})
    env.update(job.spec["payload"]["env"])
    env.update({"PYTHONUNBUFFERED": "1", "RUNNER_JOB_ID": job.paths.job_id, "RUNNER_JOB_DIR": job.paths.dir,
                "RUNNER_RESULT": result or job.paths.result})
    if staged:
        env["RUNNER_STAGED"] = "1"
    devices = job.spec["gpu"]["devices"] if slot is None else slot[1]
    if devices:
        # nvidia-smi numbers GPUs in PCI bus order; CUDA by default puts the fastest first. Same order, so
        # "GPU 1" is the card whose memory the preflight and the drain checked.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    if slot is not None:
        env["RUNNER_GPU_SLOT"] = str(slot[0])
    return env


def launch_payload(job: Job, argv=None, state: str = "RUNNING", phase: str = "payload running",
                   result=None, staged: bool = False, slot=None) -> subprocess.Popen:
    """The payload (argv: its prepare step or a variant; result: its RUNNER_RESULT; slot: its (index,
    devices)) in its own process group, killed as one; output appended to the log. staged: stdin a pipe."""
    argv = argv or payload_argv(job.spec)
    stdin = subprocess.PIPE if staged else subprocess.DEVNULL
    user = pwd.getpwnam(job.spec["payload"]["user"]) if job.spec["payload"].get("user") else None
    if user is not None:
        hand_result_to(user, result or job.paths.result, job.paths.dir)
    with os.fdopen(os.open(job.paths.output, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab") as log:
        try:
            proc = subprocess.Popen(argv, cwd=job.paths.dir, env=payload_env(job, result, staged, slot, user),
                                    stdin=stdin, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    **as_user(user))
        except (OSError, subprocess.SubprocessError) as exc:
            raise Fail("start-failed", "cannot start the payload %r: %s" % (argv[0], exc)) from exc
    ident = identity(proc.pid)
    job.payload_pids.add(proc.pid)
    noted = note_in_ledger(job, payload=ledger.ident(dict(ident, pgid=proc.pid)))  # first: what a restorer trusts
    now = time.time()  # payload.started_at: this process's (a sweep's variant's); started_at: the job's first
    # One durable write a process: the ledger's where it names the process, else this one. Either is whole for
    # every reader (a restorer after a crash of the supervisor) at once; the fsync only outlives a host crash.
    job.enter(state, phase, dict(payload=dict(ident, pgid=proc.pid, exit_code=None, signal=None, started_at=now),
                                 **({"started_at": now} if state == "RUNNING" and not job.status.get("started_at")
                                    else {})),
              durable=not noted or state != job.status.get("state"))
    return proc


def note_in_ledger(job: Job, **fields) -> bool:
    """fields in the ledger entry of each service the job stopped; whether there was one."""
    units = [s["unit"] for s in services.records(job.status) if s.get("stopped")]
    for unit in units:
        job.persist(lambda unit=unit: ledger.note(job.paths.root, unit, job.paths.job_id, **fields))
    return bool(units)


def as_user(user) -> dict:
    """Popen's arguments that run the child as payload.user for good: its groups, gid, then uid, set before
    exec (3.8 has no `user=`: a preexec function). None: no change."""
    if user is None:
        return {}
    groups = os.getgrouplist(user.pw_name, user.pw_gid)
    if sys.version_info >= (3, 9):
        return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": groups}

    def switch() -> None:
        os.setgroups(groups)
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
    return {"preexec_fn": switch}


def hand_result_to(user, result: str, job_dir: str) -> None:
    """The one path payload.user may write: its result file, made here (never through a link) and given to
    it. The dirs on the way stay root's, searchable only: it reaches its file by name and lists, creates or
    replaces nothing; the job's records stay root's 0600."""
    for directory in {os.path.dirname(job_dir), job_dir, os.path.dirname(result)}:
        os.chmod(directory, 0o711)
    fd = os.open(result, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.fchown(fd, user.pw_uid, user.pw_gid)
    finally:
        os.close(fd)


def watch_prepare(job: Job, proc: subprocess.Popen, flags: Flags):
    """Wait for the prepare step: None when it exited, else (state, message) why it must be stopped."""
    seconds = job.spec["limits"]["prepare_timeout"]
    deadline = time.monotonic() + seconds
    while proc.poll() is None:
        stop = interrupt_of(job, flags)
        if stop:
            return stop
        if time.monotonic() >= deadline:
            return "TIMED_OUT", "the prepare step ran past limits.prepare_timeout (%gs)" % seconds
        time.sleep(POLL_S)
    return None


def record_exit(job: Job, returncode: int, pid=None, **fields) -> int:
    """The exit code (128 + N for signal N), in status.json's payload when it is that process (pid) and as a
    `payload-exit` event. Written with status.json's next write: no restorer reads it."""
    sig = -returncode if returncode < 0 else None
    exit_code = 128 + sig if sig else returncode
    if pid is None or job.status["payload"].get("pid") == pid:
        job.status.update(exit_code=exit_code, payload=dict(job.status["payload"], exit_code=exit_code,
                                                            signal=signal_name(sig) if sig else None))
    job.event("payload-exit", exit_code=exit_code, signal=sig, **fields)
    return exit_code
