"""One job's choreography on the host, and its guard: everything between "locks held" and "final state".

    supervise: locks → record the service → stop it (policy) → drain GPU memory → run the payload
               (deadline, cancel, signals) → settle, on every path out
    settle:    kill leftovers → wait for GPU release → restore (or observe) → final state → stop the timer
    guard:     a forked process that holds the lock fds; when the supervisor dies without settling, it
               settles as a restorer (so does `supervisor.py restore`, run by the guard timer or after LOST)

`Job` is the job's status.json + events.jsonl; every state change goes through `Job.set_state`. Imports
only the stdlib, contract.py and the supervisor_host/_files rooms; supervisor.py (commands) imports it.
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import signal
import subprocess
import sys
import time
import traceback

try:  # imported as remote_payload.supervisor_job (tests)
    from .contract import DEFAULTS, RUNNING_SERVICE_STATES, TERMINAL
    from .supervisor_files import JobPaths, Locks, append_line, append_text, read_json, read_status, \
        release_reserve, write_json_atomic
    from .supervisor_host import CMD_TIMEOUT_S, HERE, POLL_S, SUPERVISOR, Fail, Systemd, describe_apps, \
        group_is_ours, group_members, health_ok, identity, kill_group, query_apps, query_gpus, refuse_too_small, \
        run_command, short_gpus, start_unit, wait_healthy
except ImportError:  # run from supervisor.py as a script: sys.path[0] is this directory
    from contract import DEFAULTS, RUNNING_SERVICE_STATES, TERMINAL
    from supervisor_files import JobPaths, Locks, append_line, append_text, read_json, read_status, \
        release_reserve, write_json_atomic
    from supervisor_host import CMD_TIMEOUT_S, HERE, POLL_S, SUPERVISOR, Fail, Systemd, describe_apps, \
        group_is_ours, group_members, health_ok, identity, kill_group, query_apps, query_gpus, refuse_too_small, \
        run_command, short_gpus, start_unit, wait_healthy

SCHEMA = 1
GPU_POLL_S = 0.5
LOCK_POLL_S = 0.5


class Interrupted(Exception):
    """A cancel or a signal stopped the job before its payload finished; carries the final state."""

    def __init__(self, state: str, message: str) -> None:
        super().__init__(message)
        self.state = state


# ── choreography ──────────────────────────────────────────────────────────────────────────────────────

class Flags:
    """What the signal handlers set; the loops look at it between steps."""

    def __init__(self) -> None:
        self.cancel = False
        self.signal = None


class Job:
    """One job's status.json and events.jsonl; every state change goes through `set_state`."""

    def __init__(self, paths: JobPaths, spec: dict, status: dict) -> None:
        self.paths, self.spec, self.status = paths, spec, status
        self.ctl = Systemd(spec["service"].get("scope", DEFAULTS["service.scope"]),
                           spec["service"].get("sudo", DEFAULTS["service.sudo"]))
        self.payload_pids = set()

    @classmethod
    def load(cls, paths: JobPaths) -> "Job":
        return cls(paths, read_json(paths.spec), read_status(paths))

    def save(self, **changes) -> None:
        self.status.update(changes)
        self.status["updated_at"] = time.time()
        self.persist(lambda: write_json_atomic(self.paths.status, self.status))

    def set_state(self, state: str, phase: str, **changes) -> None:
        self.save(state=state, phase=phase, **changes)
        self.event("state", state=state, phase=phase)

    def event(self, kind: str, **fields) -> None:
        self.persist(lambda: append_line(self.paths.events, dict(fields, t=time.time(), event=kind)))

    def note_restore(self, text: str) -> None:
        self.persist(lambda: append_text(self.paths.restore_log, text))
        self.event("restore", message=text)

    def persist(self, write) -> None:
        """A write that can never stop the choreography: the host's disk filling up (the payload's log can
        do that) must not keep the service down. On a full disk the job's reserve is given back once and the
        write retried; a write that still fails is reported on stderr (supervisor.log) and skipped."""
        try:
            write()
            return
        except OSError as exc:
            failure = exc
        if failure.errno in (errno.ENOSPC, errno.EDQUOT) and release_reserve(self.paths):
            try:
                write()
                return
            except OSError as exc:
                failure = exc
        sys.stderr.write("runner supervisor: a write failed and was skipped: %s\n" % failure)

    @property
    def terminal(self) -> bool:
        return self.status.get("state") in TERMINAL


def initial_status(spec: dict) -> dict:
    now = time.time()
    service = dict(spec["service"], was=None, now=None, stopped=False, stopped_at=None, restored_at=None,
                   downtime_s=None, healthy=None) if spec["service"]["manager"] == "systemd" else {"manager": "none"}
    return {"schema": SCHEMA, "job_id": spec["job_id"], "name": spec["name"], "state": "QUEUED", "phase": "starting",
            "message": "", "created_at": now, "started_at": None, "ended_at": None, "updated_at": now,
            "supervisor": None, "guard": None, "payload": None, "exit_code": None, "service": service,
            "gpu": dict(spec["gpu"], before=None, drained_after_s=None), "restored": False, "ending": None}


def check_interrupt(job: Job, flags: Flags) -> None:
    if flags.signal is not None:
        name = signal.Signals(flags.signal).name
        raise Interrupted("FAILED", "the supervisor got %s; the payload was stopped and the service restored" % name)
    if flags.cancel or os.path.exists(job.paths.cancel):
        raise Interrupted("CANCELLED", "cancelled on request")


def wait_for_locks(job: Job, locks: Locks, flags: Flags) -> None:
    job.set_state("QUEUED", "waiting for locks: " + ", ".join(locks.keys))
    while locks.try_acquire() is not None:
        check_interrupt(job, flags)
        time.sleep(LOCK_POLL_S)


def prepare_service(job: Job, flags: Flags) -> None:
    """Record the service's state; stop it when the policy (decided here, on the host) says so."""
    service = job.status["service"]
    if service["manager"] != "systemd":
        return
    before = job.ctl.show(service["unit"])
    job.save(service=dict(service, was=before["active_state"], now=before["active_state"]))
    job.event("service", unit=service["unit"], **before)
    if before["active_state"] in RUNNING_SERVICE_STATES and should_stop(job):
        check_interrupt(job, flags)
        stop_service(job)


def measure_gpus(job: Job) -> None:
    """The job's cards before anything is stopped; a card smaller than the need fails the job here, with the
    service untouched (contract.memory_verdict "too-small": no stop and no drain can help)."""
    gpu = job.spec["gpu"]
    if not gpu["devices"]:
        return
    gpus = query_gpus(gpu["devices"])
    job.save(gpu=dict(job.status["gpu"], before=gpus))
    refuse_too_small(gpus, gpu["required_mib"])


def should_stop(job: Job) -> bool:
    policy = job.spec["service"]["stop"]
    if policy != "if-needed":
        return policy == "always"
    before = job.status["gpu"]["before"]
    return bool(before) and bool(short_gpus(before, job.spec["gpu"]["required_mib"]))


def stop_service(job: Job) -> None:
    unit = job.spec["service"]["unit"]
    start_guard_timer(job)
    # Marked stopped before asking, so every restore path brings it back even if we die mid-stop.
    job.set_state("STOPPING_SERVICE", "stopping " + unit,
                  service=dict(job.status["service"], stopped=True, stopped_at=time.time()))
    try:
        job.ctl.change("stop", unit, timeout=600)
    except Fail:
        if job.ctl.is_active(unit) in RUNNING_SERVICE_STATES:  # it still runs: nothing to restore
            job.save(service=dict(job.status["service"], stopped=False, stopped_at=None))
        raise
    job.save(service=dict(job.status["service"], now=job.ctl.is_active(unit)))


def timer_unit(job_id: str) -> str:
    return "runner-guard-" + re.sub(r"[^A-Za-z0-9:_.-]", "_", job_id)


def guard_timer_seconds(spec: dict) -> float:
    """Later than any job that is still being handled could end: the timer fires once, and a `restore` that
    finds the supervisor or guard alive does nothing. Run, grace, two drains, the stop and start commands,
    the health wait, and a minute."""
    return (spec["limits"]["max_runtime"] + spec["limits"]["grace"] + 2 * spec["gpu"]["drain_timeout"]
            + 2 * CMD_TIMEOUT_S + spec["service"].get("health_timeout", 0) + 60)


def start_guard_timer(job: Job) -> None:
    """Last line of defence when even the guard dies: systemd runs `restore` after the longest job could take."""
    seconds = guard_timer_seconds(job.spec)
    command = [sys.executable, SUPERVISOR, "restore", "--job-id", job.paths.job_id,
               "--root", job.paths.root]
    try:
        done = run_command(job.ctl.timer_argv(timer_unit(job.paths.job_id), seconds, command))
        ok, detail = done.returncode == 0, done.stderr.decode("utf-8", "replace").strip()[-300:]
    except Fail as exc:
        ok, detail = False, str(exc)
    job.event("guard-timer", created=ok, unit=timer_unit(job.paths.job_id) + ".timer", seconds=int(seconds),
              detail=detail)
    job.save(timer=timer_unit(job.paths.job_id) + ".timer" if ok else None)


def stop_guard_timer(job: Job) -> None:
    timer = job.status.get("timer")
    if timer:
        try:
            run_command(job.ctl.argv("systemctl", "stop", timer), timeout=30)
        except Fail as exc:
            job.event("guard-timer", stopped=False, detail=str(exc))


def drain(job: Job, flags: Flags) -> None:
    """Wait until every job GPU shows required_mib free; on timeout name the pids still holding memory."""
    gpu = job.spec["gpu"]
    if not gpu["devices"]:
        return
    need = gpu["required_mib"]
    job.set_state("DRAINING", "waiting for %d MiB free on GPU %s" % (need, ",".join(gpu["devices"])))
    started = time.monotonic()
    while True:
        gpus = query_gpus(gpu["devices"])
        refuse_too_small(gpus, need)
        short = short_gpus(gpus, need)
        if not short:
            job.save(gpu=dict(job.status["gpu"], drained_after_s=round(time.monotonic() - started, 3)))
            job.event("gpu", phase="drained", gpus=gpus)
            return
        check_interrupt(job, flags)
        if time.monotonic() - started >= gpu["drain_timeout"]:
            raise Fail("drain-timeout", drain_message(short, need, gpu["drain_timeout"], query_apps()))
        time.sleep(GPU_POLL_S)


def drain_message(short: list, need: int, waited: float, apps: list) -> str:
    gaps = "; ".join("GPU %s: %s MiB free < %d MiB needed" % (g["index"], g["free_mib"], need) for g in short)
    return "%s after waiting %.0f s; memory is held by %s" % (gaps, waited, describe_apps(apps))


def payload_argv(spec: dict) -> list:
    payload = spec["payload"]
    if payload["command"] is not None:
        return list(payload["command"])
    return [payload["python"], os.path.join(HERE, payload["script"])] + payload["args"]


def payload_env(job: Job) -> dict:
    env = dict(os.environ)
    env.update(job.spec["payload"]["env"])
    env.update({"PYTHONUNBUFFERED": "1", "RUNNER_JOB_ID": job.paths.job_id, "RUNNER_JOB_DIR": job.paths.dir,
                "RUNNER_RESULT": job.paths.result})
    if job.spec["gpu"]["devices"]:
        # nvidia-smi numbers GPUs in PCI bus order; CUDA by default puts the fastest first. Same order, so
        # "GPU 1" is the card whose memory the preflight and the drain checked.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(job.spec["gpu"]["devices"])
    return env


def launch_payload(job: Job) -> subprocess.Popen:
    """The payload in its own process group (so the group can be killed as one), output appended to the log."""
    with open(job.paths.output, "ab") as log:
        try:
            proc = subprocess.Popen(payload_argv(job.spec), cwd=job.paths.dir, env=payload_env(job),
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        except OSError as exc:
            raise Fail("start-failed", "cannot start the payload %r: %s" % (payload_argv(job.spec)[0], exc))
    ident = identity(proc.pid)
    job.payload_pids.add(proc.pid)
    job.set_state("RUNNING", "payload running", started_at=time.time(),
                  payload=dict(ident, pgid=proc.pid, exit_code=None, signal=None))
    return proc


def watch_payload(job: Job, proc: subprocess.Popen, flags: Flags):
    """Wait for the payload; returns None when it exited, or (state, message) when it must be stopped."""
    deadline = time.monotonic() + job.spec["limits"]["max_runtime"]
    next_sample = 0.0
    while proc.poll() is None:
        if time.monotonic() >= next_sample:  # remember the group's pids: they may hold GPU memory later
            job.payload_pids.update(group_members(proc.pid))
            next_sample = time.monotonic() + 1.0
        try:
            check_interrupt(job, flags)
        except Interrupted as stop:
            return stop.state, str(stop)
        if time.monotonic() >= deadline:
            return "TIMED_OUT", "the payload ran past limits.max_runtime (%gs)" % job.spec["limits"]["max_runtime"]
        time.sleep(POLL_S)
    return None


def record_exit(job: Job, returncode: int) -> None:
    sig = -returncode if returncode < 0 else None
    exit_code = 128 + sig if sig else returncode
    job.save(exit_code=exit_code, payload=dict(job.status["payload"], exit_code=exit_code,
                                               signal=signal.Signals(sig).name if sig else None))
    job.event("payload-exit", exit_code=exit_code, signal=sig)


def run_payload(job: Job, flags: Flags) -> None:
    check_interrupt(job, flags)
    proc = launch_payload(job)
    stop = watch_payload(job, proc, flags)
    if stop is not None:
        job.set_state("TERMINATING", stop[1], ending={"state": stop[0], "message": stop[1]})
    job.payload_pids.update(group_members(proc.pid))
    # Also after a normal exit: children left in the group may still hold GPU memory.
    kill_group(proc.pid, job.spec["limits"]["grace"], proc)
    record_exit(job, proc.wait())
    if stop is not None:
        raise Interrupted(*stop)


def wait_gpu_release(job: Job) -> None:
    """Bounded wait until no process of the payload still holds GPU memory (the service needs it back)."""
    payload = job.status.get("payload")
    if not job.spec["gpu"]["devices"] or not payload:
        return
    ours = job.payload_pids | {int(payload["pid"])}
    deadline = time.monotonic() + job.spec["gpu"]["drain_timeout"]
    while True:
        try:
            holding = [a for a in query_apps() if a["pid"] in ours]
        except (Fail, ValueError) as exc:
            job.event("gpu", phase="release", error=str(exc))
            return
        if not holding:
            return
        if time.monotonic() >= deadline:
            job.event("gpu", phase="release-timeout", holding=holding)
            return
        time.sleep(GPU_POLL_S)


def stopped_by_us(service: dict) -> bool:
    """We stopped a service that was running: it must be restored."""
    return bool(service.get("stopped")) and service.get("was") in RUNNING_SERVICE_STATES


def restore(job: Job) -> None:
    """Start the service this job stopped and wait until it is healthy (bounded by health_timeout)."""
    service, spec_service = job.status["service"], job.spec["service"]
    unit = service["unit"]
    job.note_restore("starting %s" % unit)
    deadline = time.monotonic() + spec_service["health_timeout"]
    try:
        why = start_unit(job.ctl, unit, spec_service["health_timeout"])
        if why:
            job.note_restore(why)
        healthy, now = wait_healthy(job.ctl, unit, spec_service["health_url"], deadline - time.monotonic())
    except Fail as exc:
        job.note_restore("restoring %s failed: %s" % (unit, exc))
        healthy, now = False, "unknown"
    restored_at = time.time()
    job.save(service=dict(service, now=now, healthy=healthy, restored_at=restored_at,
                          downtime_s=round(restored_at - (service.get("stopped_at") or restored_at), 3)))
    job.note_restore("%s is %s, %s" % (unit, now, "healthy" if healthy else "NOT healthy"))


def observe(job: Job) -> None:
    """Record how a service this job did not stop looks at the end: one probe, no waiting, no change."""
    service, url = job.status["service"], job.spec["service"].get("health_url")
    if service["manager"] != "systemd" or service.get("was") is None:
        return
    try:
        now = job.ctl.is_active(service["unit"])
    except Fail as exc:
        job.event("service", error=str(exc))
        return
    running = service.get("was") in RUNNING_SERVICE_STATES
    healthy = now == "active" and (not url or health_ok(url, 5.0)) if running else None
    job.save(service=dict(service, now=now, healthy=healthy))


def kill_leftovers(job: Job) -> None:
    payload = job.status.get("payload")
    if payload and group_is_ours(payload):
        job.payload_pids.update(group_members(int(payload["pgid"])))
        kill_group(int(payload["pgid"]), job.spec["limits"]["grace"])


def settle(job: Job, decide, ended_at=None) -> None:
    """The end of every job, whoever runs it: kill leftovers → wait for GPU release → restore (or observe)
    → final state. `decide()` names the final (state, message) once the service is back or not; ended_at
    is kept when the job had ended already (LOST)."""
    if not job.terminal:
        job.set_state("RESTORING", "restoring the host")
    for step in (kill_leftovers, wait_gpu_release):
        try:
            step(job)
        except Exception as exc:  # nothing before the restore may keep the service down
            job.event("settle", error="%s: %s" % (type(exc).__name__, exc))
    if stopped_by_us(job.status["service"]):
        restore(job)
    else:
        observe(job)
    state, message = decide()
    job.set_state(state, "done", message=message, ended_at=ended_at or time.time(), restored=True)
    stop_guard_timer(job)


def final_state(job: Job, ending) -> tuple:
    """SUCCEEDED only if the payload exited 0 and the service (when we stopped it) is back healthy."""
    service = job.status["service"]
    service_back = not stopped_by_us(service) or service.get("healthy")
    note = "" if service_back else "; the service %s did not come back healthy" % service.get("unit")
    if ending is not None:
        return ending[0], ending[1] + note
    if job.status.get("exit_code") == 0:
        return ("SUCCEEDED", "payload exited 0") if service_back else ("FAILED", "payload exited 0" + note)
    return "FAILED", "payload exited with code %s%s" % (job.status.get("exit_code"), note)


def supervise(job: Job, locks: Locks, flags: Flags) -> None:
    """The whole job; `settle` runs on every path out, exceptions included."""
    ending = None
    try:
        if not locks.held:
            wait_for_locks(job, locks, flags)
        locks.write_holders()
        measure_gpus(job)
        prepare_service(job, flags)
        drain(job, flags)
        run_payload(job, flags)
    except Interrupted as stop:
        ending = (stop.state, str(stop))
    except Fail as exc:
        ending = ("FAILED", str(exc))
    except Exception as exc:  # a bug here must still end in a restored host and a readable status
        traceback.print_exc()
        ending = ("FAILED", "supervisor error: %s: %s" % (type(exc).__name__, exc))
    finally:
        settle(job, lambda: final_state(job, ending))
        # Only after a finished restore: if settle raised, the guard's inherited lock fds keep the host
        # locked until it has restored the service (LOCK_UN would release its copies too).
        locks.release()


# ── guard ─────────────────────────────────────────────────────────────────────────────────────────────

def start_guard(job: Job, locks: Locks) -> None:
    """Fork the guard: it holds the lock fds and the read end of a pipe only the supervisor can write to.
    The write end stays open, unused, until the supervisor exits however it exits: that EOF wakes the guard."""
    life_r, life_w = os.pipe()
    keep = [life_r] + list(locks.fds.values())
    argv = [sys.executable, SUPERVISOR, "_guard", "--job-id", job.paths.job_id,
            "--root", job.paths.root, "--life-fd", str(life_r)]
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            for fd in keep:
                os.set_inheritable(fd, True)
            os.execv(sys.executable, argv)
        finally:
            os._exit(127)
    os.close(life_r)
    job.save(guard=identity(pid))


def settle_as_restorer(job: Job, message: str) -> None:
    """Settle a job whose supervisor is gone (the guard, or `restore`): keep a decided or terminal state
    (TIMED_OUT, CANCELLED, LOST), else FAILED; `message` says who settled it."""
    if job.terminal and job.status.get("restored"):
        return
    ending = job.status.get("ending")
    state = job.status["state"] if job.terminal else (ending or {}).get("state", "FAILED")
    job.note_restore(message)
    settle(job, lambda: (state, message), ended_at=job.status.get("ended_at"))


def with_restore_lock(job: Job, action) -> bool:
    """Run action under the job's restore lock; False when another restorer holds it."""
    fd = os.open(job.paths.restore_lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    try:
        action()
        return True
    finally:
        os.close(fd)


