"""Every path out of a job, and the processes that take it when the supervisor cannot.

    settle:    kill leftovers → wait for GPU release → restore (or observe) → final state → stop the timer
    ledger:    a stop recorded by a job whose supervisor and guard are gone is adopted by the next job
    guard:     a forked process that holds the lock fds; when the supervisor dies without settling (or is
               alive past `hard_deadline`), it settles as a restorer (so does `supervisor.py restore`, run by
               the guard timer, the last line where the host has systemd)

Its time bounds (the guard timer, the hard deadline) are the job's recorded budget (supervision/budget.py). Imports
only the stdlib, contract.py, host/ (answer, bundle, gpu, processes, systemd, engine) and the files, record, ledger,
services and budget rooms.
"""
from __future__ import annotations

import fcntl
import json
import os
import pwd
import re
import signal
import sys
import time

from ..admission import describe_holder
from ..contract import RUNNING_SERVICE_STATES, TERMINAL, job_id_problem, root_problem
from ..host import engine, health, unit_stop
from ..host.answer import Fail
from ..host.bundle import RUN_SUPERVISOR
from ..host.gpu import query_apps
from ..host.processes import (
    KILL_CONFIRM_S,
    group_is_ours,
    group_of,
    identity,
    is_alive,
    kill_group,
    run_command,
    user_processes_in_own_cgroup,
)
from ..host.systemd import start_unit
from . import ledger, services
from .budget import recorded
from .files import JobPaths, read_json
from .locks import Locks, flock_holders
from .record import Job

GPU_POLL_S = 0.5


# ── the guard timer ───────────────────────────────────────────────────────────────────────────────────

def timer_unit(job_id: str) -> str:
    return "runner-guard-" + re.sub(r"[^A-Za-z0-9:_.-]", "_", job_id)


def start_guard_timer(job: Job, bound: str = "guard_timer_s") -> None:
    """Last line of defence when even the guard dies: systemd runs `restore` after the longest job could take
    (the budget's `bound`), and kills it if it runs longer than ExecStopPost='s `restore` may (timeout_stop_s).
    It fires once; a `restore` that finds the supervisor or guard alive does nothing."""
    if job.status.get("timer"):  # one per job, however many of its services it stops
        return
    bounds = recorded(job.spec, job.status)
    seconds = bounds[bound]
    command = RUN_SUPERVISOR + ["restore", "--job-id", job.paths.job_id, "--root", job.paths.root]
    try:
        done = run_command(job.ctl.timer_argv(timer_unit(job.paths.job_id), seconds, command,
                                              bounds["timeout_stop_s"]))
        ok, detail = done.returncode == 0, done.stderr.decode("utf-8", "replace").strip()[-300:]
    except Fail as exc:
        ok, detail = False, str(exc)
    job.event("guard-timer", created=ok, unit=timer_unit(job.paths.job_id) + ".timer", seconds=int(seconds),
              detail=detail)
    job.save(timer=timer_unit(job.paths.job_id) + ".timer" if ok else None)


def stop_guard_timer(job: Job) -> None:
    """The job's own timer, by the name its job id gives (status.json's `timer` only says there is one: the
    payload can write it, and must not name a unit for root to stop)."""
    timer = job.status.get("timer") and timer_unit(job.paths.job_id) + ".timer"
    if timer:
        try:
            run_command(job.ctl.argv("systemctl", "stop", timer), timeout=30)
        except Fail as exc:
            job.event("guard-timer", stopped=False, detail=str(exc))


# ── settle ────────────────────────────────────────────────────────────────────────────────────────────

def wait_gpu_release(job: Job) -> None:
    """Bounded wait until no process of the payload still holds GPU memory (the service needs it back): a
    holder is the payload's when it is one of its processes or in one of their process groups (each payload
    process leads its own), looked up for the few holders only, never by listing the host's processes."""
    payload = job.status.get("payload")
    if not job.spec["gpu"]["devices"] or not payload:
        return
    ours = job.payload_pids | {int(payload["pid"])}
    deadline = time.monotonic() + job.spec["gpu"]["drain_timeout"]
    while True:
        try:
            holding = [a for a in query_apps() if a["pid"] in ours or group_of(a["pid"]) in ours]
        except (Fail, ValueError) as exc:
            job.event("gpu", phase="release", error=str(exc))
            return
        if not holding:
            return
        if time.monotonic() >= deadline:
            job.event("gpu", phase="release-timeout", holding=holding)
            return
        time.sleep(GPU_POLL_S)


def hard_deadline(spec: dict, status: dict):
    """When a supervisor that is still alive counts as hung (failed): the start of the step it is in plus the
    budget's hung_*_s for it (every wait of that step at its own bound, and a margin). None where nothing of
    the service waits on it."""
    if status.get("state") in TERMINAL:
        return None
    bounds = recorded(spec, status)
    state, since = status.get("state"), status.get("updated_at") or time.time()
    if state == "RESTORING":
        return since + bounds["hung_restoring_s"]
    # Once the job has started, the run counts from the payload process's own start (a sweep's variants each
    # get max_runtime); a prepare step before it (service untouched) sets no started_at: no hard deadline.
    started = status.get("started_at")
    if started:
        return ((status.get("payload") or {}).get("started_at") or started) + bounds["hung_running_s"]
    if state == "DRAINING":
        return since + bounds["hung_draining_s"]
    if state == "STOPPING_SERVICE":
        return since + bounds["hung_stopping_s"]
    return None


def stopped_by_us(service: dict) -> bool:
    """We stopped a service that was running: it must be restored."""
    return bool(service.get("stopped")) and service.get("was") in RUNNING_SERVICE_STATES


def restore(job: Job, since=None) -> None:
    """Start the service this job stopped (or resume the engine it released) and wait until it is healthy
    (bounded by health_timeout, counted from `since`: a job's services are restored one after another
    within one such bound, each started at once)."""
    service, spec_service = job.status["service"], job.spec["service"]
    unit, began = service["unit"], time.time()
    deadline = (time.monotonic() if since is None else since) + spec_service["health_timeout"]
    if service.get("released"):  # freed through the engine's API: resumed, the unit restarted if that fails
        healthy, now = engine.restore_released(job, deadline)
    else:
        healthy, now = start_and_wait(job, unit, deadline)
    restored_at = time.time()
    service = job.status["service"]  # with what the restore recorded (service.resumed)
    job.save(service=dict(service, now=now, healthy=healthy, restored_at=restored_at,
                          downtime_s=round(restored_at - (service.get("stopped_at") or restored_at), 3),
                          downtime=engine.downtime(service, job.status.get("gpu"), began, restored_at, healthy)))
    job.note_restore("%s is %s, %s" % (unit, now, "healthy" if healthy else "NOT healthy"))


def start_and_wait(job: Job, unit: str, deadline: float) -> tuple:
    """`systemctl start` and the health wait; returns (healthy, active_state)."""
    spec_service = job.spec["service"]
    job.note_restore("starting %s" % unit)
    try:
        began = time.monotonic()
        clear_failed_stop(job, unit)
        why = start_unit(job.ctl, unit, deadline - time.monotonic())
        if why:
            job.note_restore(why)
        started = time.monotonic()
        healthy, now = health.wait_healthy(job.ctl, unit, spec_service["health_url"], deadline - time.monotonic(),
                                           job.note_restore)
        job.save(service=dict(job.status["service"], resumed={
            "how": "start", "resume_s": round(started - began, 3), "health_s": round(time.monotonic() - started, 3)}))
        return healthy, now
    except Fail as exc:
        job.note_restore("restoring %s failed: %s" % (unit, exc))
        return False, "unknown"


def clear_failed_stop(job: Job, unit: str) -> None:
    """Our stop left the unit failed (its engine's shutdown under our SIGTERM): `reset-failed` before the
    start, so the failure the stop caused is not left behind as the service's."""
    stop_result = job.status["service"].get("stop_result")
    if not stop_result:
        return
    why = unit_stop.reset_failed(job.ctl, unit)
    job.note_restore(why or "%s was left failed by this job's stop (Result=%s): reset-failed before the start"
                     % (unit, stop_result.get("result")))


OBSERVE_HEALTH_S = 5.0  # how long the end of a job may look at a service it did not stop


def observe(job: Job) -> None:
    """Record how a service this job did not stop looks at the end: its state, and its health within
    OBSERVE_HEALTH_S (a few probes: one slow or refused answer on a loaded host is not the service's state);
    nothing changed."""
    service, url = job.status["service"], job.spec["service"].get("health_url")
    if service["manager"] != "systemd" or service.get("was") is None:
        return
    try:
        now = job.ctl.is_active(service["unit"])
    except Fail as exc:
        job.event("service", error=str(exc))
        return
    running = service.get("was") in RUNNING_SERVICE_STATES
    healthy = now == "active" and (not url or healthy_within(url, OBSERVE_HEALTH_S)) if running else None
    job.save(service=dict(service, now=now, healthy=healthy))


def healthy_within(url: str, seconds: float) -> bool:
    """Whether url answers 2xx within `seconds`, probed every 0.5 s (each probe bounded by what is left)."""
    end = time.monotonic() + seconds
    while not health.health_ok(url, end - time.monotonic()):
        if time.monotonic() + 0.5 >= end:
            return False
        time.sleep(0.5)
    return True


def kill_leftovers(job: Job) -> None:
    """The payload's group, and each group a sweep's slots still name (variants side by side)."""
    slots = [s for s in job.status.get("slots") or [] if isinstance(s, dict) and isinstance(s.get("pgid"), int)]
    for payload in [job.status.get("payload")] + slots:
        if payload and group_is_ours(payload):
            job.payload_pids.add(int(payload["pgid"]))  # its members' GPU memory is waited for by group
            grace = job.spec["limits"]["grace"]
            since = (job.status.get("ending") or {}).get("at")
            if since:  # the payload got its TERM then: a restorer gives only what is left of the grace
                grace = min(grace, max(0.0, since + grace - time.time()))
            kill_group(int(payload["pgid"]), grace)
    kill_user_leftovers(job)


def kill_user_leftovers(job: Job) -> None:
    """With payload.user: every process of that user still in the job's cgroup (the supervisor's unit), such as
    a child that left the payload's process group (setsid). Alive, it could hold the stopped service's port and
    answer the restorer's health check itself while the restarted unit cannot bind. KILLed (its group had its
    grace), again while the user forks."""
    try:
        uid = pwd.getpwnam(job.spec["payload"].get("user") or "").pw_uid
    except KeyError:
        return
    if uid == 0 or uid == os.getuid():
        return  # not another user: its processes are the supervisor's own
    deadline = time.monotonic() + KILL_CONFIRM_S
    while time.monotonic() < deadline:
        left = user_processes_in_own_cgroup(uid)
        if not left:
            return
        job.payload_pids.update(left)  # they may hold GPU memory: the release waits for them too
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def settle(job: Job, decide, ended_at=None) -> None:
    """The end of every job, whoever runs it: kill leftovers → wait for GPU release → restore (or observe)
    each of its services → final state. `decide()` names the final (state, message) once the services are
    back or not; ended_at is kept when the job had ended already (LOST)."""
    if not job.terminal:
        job.set_state("RESTORING", "restoring the host")
    for step in (kill_leftovers, wait_gpu_release):
        try:
            step(job)
        except Exception as exc:  # nothing before the restore may keep the service down
            job.event("settle", error="%s: %s" % (type(exc).__name__, exc))
    views = services.views(job)
    owed = [view for view in views if not (stopped_by_us(view.status["service"]) and handed_over(view))
            and owes(view)]
    several = len(owed) > 1
    since = time.monotonic()
    for view in owed if several else []:
        kick(view)
    for view in views:
        if view in owed and several:
            restore(view, since)
        elif view in owed:
            restore(view)
        else:
            observe(view)
        settle_entry_of(view, view in owed)
    state, message = decide()
    job.set_state(state, "done", message=message, ended_at=ended_at or time.time(), restored=True)
    stop_guard_timer(job)


def owes(job: Job) -> bool:
    """Whether the job still owes its service's restore: the host ledger's word alone (status.json's
    service.stopped is the payload's to write). What the entry says of the stop (the state before it, when,
    the engine it released) replaces the record's, so the restore works from it."""
    service = job.status["service"]
    entry = ledger.read_entry(job.paths.root, service["unit"])
    if not ledger.same_job(entry, job.paths.root, job.paths.job_id) or entry.get("was") not in RUNNING_SERVICE_STATES:
        return False
    stopped_at = service.get("stopped_at") if stopped_by_us(service) else entry.get("stopped_at")
    job.save(service=dict(service, stopped=True, was=entry["was"], released=entry.get("released"),
                          stopped_at=stopped_at if isinstance(stopped_at, (int, float)) else time.time()))
    return True


def settle_entry_of(job: Job, restored: bool) -> None:
    """After the restore: only a restorer that saw its unit back (systemd: active, and healthy) drops the
    entry. A failed restore leaves the stop owed, noted as tried (the job's record of its end then stands),
    for the job's next restorer or the next job on the service to adopt. An entry of a stop not owed (the
    service was not running before it) is dropped."""
    unit = job.status["service"]["unit"]
    if restored and not (job.status["service"].get("healthy") and job.status["service"].get("now") == "active"):
        ledger.note_restore_failed(job.paths.root, unit, job.paths.job_id)
        return
    ledger.clear(job.paths.root, unit, job.paths.job_id)


def restore_unit(job: Job, unit: str) -> None:
    """One of the job's services alone (`restore-service --unit`), its ledger entry cleared once it is back;
    the job's other stops stay owed, and settle later restores only those (`restored_alone`)."""
    for view in services.views(job):
        if view.status["service"]["unit"] == unit and owes(view):
            restore(view)
            view.save(service=dict(view.status["service"], restored_alone=True))
            settle_entry_of(view, True)


def kick(view) -> None:
    """Several services to restore: each stopped unit is started without waiting, so their health waits
    overlap (restore then starts an active unit again: nothing) and all fit one health_timeout."""
    if view.status["service"].get("released"):
        return  # resumed through its engine's API by restore itself
    try:
        view.ctl.change("start", view.status["service"]["unit"], "--no-block")
    except Fail as exc:
        view.note_restore("starting %s: %s" % (view.status["service"]["unit"], exc))


def handed_over(job: Job) -> bool:
    """Another job adopted our stop (the ledger names it): the restore is its to do, under its own run."""
    entry = ledger.read_entry(job.paths.root, job.status["service"]["unit"])
    if not entry or entry.get("job_id") is None or ledger.same_job(entry, job.paths.root, job.paths.job_id):
        return False
    job.note_restore("job %s adopted the stop of %s; it restores the service" % (entry["job_id"], entry["unit"]))
    job.save(service=dict(job.status["service"], handed_to=entry["job_id"]))
    return True


def settle_ledger(job: Job) -> None:
    """With the job's locks held: settle the ledger entry of each of its services (settle_entry). A stop that
    another login's job made and still owes is not ours to adopt: the job ends here, nothing touched."""
    for view in services.views(job):
        unit = view.status["service"]["unit"]
        entry = ledger.foreign_entry(job.paths.root, unit)
        if entry and view.ctl.is_active(unit) not in RUNNING_SERVICE_STATES:
            raise Fail("busy", "%s was stopped by %s and is not restored yet: that login's restorers bring it "
                       "back; nothing was stopped" % (unit, describe_holder(entry)))
    for view in services.views(job):
        settle_entry(view)


def settle_entry(job: Job) -> None:
    """With the service's lock held: an entry naming another job is a stop nobody will restore (that job's
    supervisor and guard are gone, or they would hold the lock). Adopt it: we restore it after our run, and
    the dead job is settled as handed over. An entry whose service runs again is only dropped."""
    service = job.status["service"]
    entry = ledger.read_entry(job.paths.root, service["unit"])
    if not entry or ledger.same_job(entry, job.paths.root, job.paths.job_id):
        return
    unit, previous = service["unit"], entry.get("job_id")
    now = job.ctl.is_active(unit)
    if now in RUNNING_SERVICE_STATES and not entry.get("released"):  # a released engine runs but does not serve
        ledger.clear(entry.get("root", job.paths.root), unit, previous)
        job.event("ledger", unit=unit, dropped_from=previous, now=now,
                  message="%s was recorded as stopped by job %s but runs again: nothing to restore" % (unit, previous))
        return
    hand_over(job, entry)
    job.save(service=dict(service, was=entry.get("was") or "active", now=now, stopped=True,
                          stopped_at=entry.get("stopped_at") or time.time(), adopted_from=previous,
                          released=entry.get("released")))
    start_guard_timer(job, "adopted_timer_s")  # before this job's prepare step and staging
    ledger.record_stop(job.paths.root, unit, job.paths.job_id, job.status["service"], job.spec["gpu"]["devices"],
                       adopted_from=previous, stopped_at=job.status["service"]["stopped_at"],
                       released=entry.get("released"), service_gpus=job.spec["service"].get("gpus", []))
    job.event("ledger", unit=unit, adopted_from=previous, message="%s already stopped by job %s and not restored; "
              "job %s adopts it and will restore it" % (unit, previous, job.paths.job_id))


def hand_over(job: Job, entry: dict) -> None:
    """Settle the dead job whose stop we adopt (under its own host.root, this login's): kill what is left of
    its payload, record who restores."""
    previous, root = entry.get("job_id"), entry.get("root", job.paths.root)
    if not previous or root_problem(root) or job_id_problem(previous):
        return
    if not os.path.isdir(JobPaths(root, previous).dir):
        return
    paths = JobPaths(root, previous)
    unit = job.status["service"]["unit"]

    def settle_dead():
        dead = Job.load(paths)  # read under its restore lock: no other restorer is halfway through
        if dead.status.get("restored"):
            return
        if [e for e in ledger.entries_of(root, previous) if e.get("unit") != unit]:
            dead.note_restore("job %s adopted the stop of %s; the job's other stops are still owed" % (
                job.paths.job_id, unit))
            return  # its other services: whoever settles them (their next job, or the job's own restorers)
        try:
            kill_leftovers(dead)
        except Exception as exc:  # its leftovers must not keep our job (and the service) waiting
            job.event("ledger", error="killing leftovers of %s: %s" % (previous, exc))
        message = "supervisor and guard died with the service stopped; job %s adopted the stop and restores it" \
            % job.paths.job_id
        dead.note_restore(message)
        dead.set_state(dead.status["state"] if dead.terminal else "LOST", "done", message=message, restored=True,
                       ended_at=dead.status.get("ended_at") or time.time(),
                       service=dict(dead.status["service"], handed_to=job.paths.job_id))
        stop_guard_timer(dead)
    try:
        with_restore_lock(Job.load(paths), settle_dead)
    except Fail as exc:
        job.event("ledger", error="cannot settle job %s: %s" % (previous, exc))


def final_state(job: Job, ending) -> tuple:
    """SUCCEEDED only if the payload exited 0 and every service we stopped is back healthy."""
    down = [r["unit"] for r in services.records(job.status) if stopped_by_us(r) and not r.get("healthy")]
    service_back = not down
    note = "" if service_back else "; the service %s did not come back healthy" % ", ".join(down)
    if ending is not None:
        return ending[0], ending[1] + note
    if job.status.get("exit_code") == 0:
        return ("SUCCEEDED", "payload exited 0") if service_back else ("FAILED", "payload exited 0" + note)
    return "FAILED", "payload exited with code %s%s" % (job.status.get("exit_code"), note)


# ── guard ─────────────────────────────────────────────────────────────────────────────────────────────

def start_guard(job: Job, locks: Locks) -> None:
    """Fork the guard: it holds the lock fds and the read end of a pipe only the supervisor can write to (its
    end is not inherited by the payload). The supervisor tells the guard over it what its deadlines count
    from (Job.tell_guard); the write end stays open until the supervisor exits however it exits: that EOF
    wakes the guard."""
    life_r, life_w = os.pipe()
    keep = [life_r] + list(locks.fds.values())
    argv = RUN_SUPERVISOR + ["_guard", "--job-id", job.paths.job_id, "--root", job.paths.root,
                             "--life-fd", str(life_r)]
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
    os.set_blocking(life_w, False)
    job.guard_pipe = life_w
    job.save(guard=identity(pid))
    job.tell_guard()  # the first line, before any of the payload's code runs


class Told:
    """What the supervisor told its guard over the life pipe (Job.tell_guard), the guard's only source for
    its hard deadline: the last whole line."""

    def __init__(self, fd: int) -> None:
        self.fd, self.pending = fd, b""
        self.last: dict | None = None  # the latest record the supervisor told

    def read(self) -> bool:
        """Take what the pipe holds; False at EOF (the supervisor is gone)."""
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
            return False
        lines = (self.pending + chunk).split(b"\n")
        self.pending = lines.pop()[-(1 << 16):]
        for line in reversed(lines):
            try:
                told = json.loads(line.decode("ascii"))
            except ValueError:
                continue
            if isinstance(told, dict) and isinstance(told.get("budget"), dict):
                self.last = told
                break
        return True

    def deadline(self):
        """hard_deadline over what the supervisor said (None before its first line)."""
        return hard_deadline({}, self.last) if self.last else None

    def supervisor(self):
        return (self.last or {}).get("supervisor")


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
    """Run action under the job's restore lock; False when another restorer holds it. The holder writes who it
    is and until when its restore may run (timeout_stop_s, ExecStopPost='s bound), so a later restorer can take
    over from one that hangs past it (take_over_hung_restorer)."""
    # payload.user can reach the job dir by name: a lock file it could open, it could flock against every
    # restorer (they all run as root then, so 0600 keeps nobody out)
    mode = 0o600 if job.spec["payload"].get("user") else 0o644
    fd = os.open(job.paths.restore_lock, os.O_RDWR | os.O_CREAT, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    try:
        until = time.time() + recorded(job.spec, job.status)["timeout_stop_s"]
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(dict(identity(os.getpid()), until=until)).encode())
        action()
        return True
    finally:
        os.close(fd)


def take_over_hung_restorer(job: Job) -> bool:
    """SIGKILL the restorer that holds the job's restore lock past its bound (hung); True once it is gone. Its
    record is believed only for a process the kernel shows holding that very lock (/proc/locks)."""
    try:
        holder = read_json(job.paths.restore_lock)  # the payload's to replace: never a blocking open
        info = os.stat(job.paths.restore_lock)
    except (OSError, ValueError):
        return False
    until = holder.get("until") if isinstance(holder, dict) else None
    if not isinstance(until, (int, float)) or time.time() <= until or not is_alive(holder) \
            or int(holder["pid"]) not in flock_holders(info):
        return False
    try:
        os.kill(int(holder["pid"]), signal.SIGKILL)
    except OSError:
        return False  # another user's (root's guard timer): not ours to end
    job.note_restore("restorer pid %d held the restore lock past its bound (hung): killed, taken over"
                     % int(holder["pid"]))
    deadline = time.monotonic() + KILL_CONFIRM_S
    while is_alive(holder) and time.monotonic() < deadline:
        time.sleep(GPU_POLL_S)
    return not is_alive(holder)
