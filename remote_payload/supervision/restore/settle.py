"""A job's end, whoever runs it (the supervisor, or a restorer: restorers.py), and the guard timer.

    settle:  kill leftovers → wait for the GPU's release → bring back each service the job owes (observe the
             others) → settle each ledger entry → final state → stop the guard timer
"""
from __future__ import annotations

import os
import pwd
import re
import signal
import time

from ...contract import RUNNING_SERVICE_STATES
from ...host import health
from ...host.answer import Fail
from ...host.bundle import RUN_SUPERVISOR
from ...host.gpu import query_apps
from ...host.processes import (
    KILL_CONFIRM_S,
    group_is_ours,
    group_of,
    kill_group,
    run_command,
    user_processes_in_own_cgroup,
)
from .. import ledger, services
from ..budget import recorded
from ..record import Job
from .bring_back import bring_back, start_without_waiting
from .owed import owes, stopped_by_us

GPU_POLL_S = 0.5


# ── the guard timer ───────────────────────────────────────────────────────────────────────────────────

def timer_unit(job_id: str) -> str:
    return "runner-guard-" + re.sub(r"[^A-Za-z0-9:_.-]", "_", job_id)


def start_guard_timer(job: Job, bound: str = "guard_timer_s") -> None:
    """Last line of defence when even the guard dies: systemd runs `restore` once, after `bound`."""
    if job.status.get("timer"):  # one per job, however many of its services it stops
        return
    bounds, name = recorded(job.spec, job.status), timer_unit(job.paths.job_id)
    command = RUN_SUPERVISOR + ["restore", "--job-id", job.paths.job_id, "--root", job.paths.root]
    try:
        done = run_command(job.ctl.timer_argv(name, bounds[bound], command, bounds["timeout_stop_s"]))
        ok, detail = done.returncode == 0, done.stderr.decode("utf-8", "replace").strip()[-300:]
    except Fail as exc:
        ok, detail = False, str(exc)
    job.event("guard-timer", created=ok, unit=name + ".timer", seconds=int(bounds[bound]), detail=detail)
    job.save(timer=name + ".timer" if ok else None)


def stop_guard_timer(job: Job) -> None:
    """The job's own timer, named from its job id (status.json's `timer`, the payload's to write, must not
    name a unit for root to stop)."""
    timer = job.status.get("timer") and timer_unit(job.paths.job_id) + ".timer"
    if timer:
        try:
            run_command(job.ctl.argv("systemctl", "stop", timer), timeout=30)
        except Fail as exc:
            job.event("guard-timer", stopped=False, detail=str(exc))


# ── settle ────────────────────────────────────────────────────────────────────────────────────────────

def wait_gpu_release(job: Job) -> None:
    """Bounded wait until no process of the payload's groups holds GPU memory: the service needs it."""
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


OBSERVE_HEALTH_S = 5.0  # how long the end of a job may look at a service it did not stop


def observe(job: Job) -> None:
    """Record how a service this job did not stop looks at the end: its state, and its health within
    OBSERVE_HEALTH_S (one slow answer on a loaded host is not its state)."""
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
    """Whether url answers 2xx within `seconds`, probed every 0.5 s."""
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
    """With payload.user: KILL every process of that user still in the job's cgroup (one that left the
    payload's group could hold the service's port and answer the health check itself), again while it forks."""
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


def settle(job: Job, ending=None, ended_at=None) -> None:
    """The end of every job, whoever runs it: kill leftovers → wait for GPU release → bring back (or observe)
    each service → final state over `ending` (the (state, message) decided before); ended_at: kept (LOST)."""
    if not job.terminal:
        job.set_state("RESTORING", "restoring the host")
    for step in (kill_leftovers, wait_gpu_release):
        try:
            step(job)
        except Exception as exc:  # nothing before the restore may keep the service down
            job.event("settle", error="%s: %s" % (type(exc).__name__, exc))
    views = services.views(job)
    owed = [view for view in views if owes(view)]
    since = time.monotonic() if len(owed) > 1 else None  # several: one health_timeout for all of them
    for view in owed if since is not None else []:
        start_without_waiting(view)
    for view in views:
        if view in owed:
            bring_back(view, since)
        else:
            observe(view)
        close_entry(view, view in owed)
    state, message = final_state(job, ending)
    job.set_state(state, "done", message=message, ended_at=ended_at or time.time(), restored=True)
    stop_guard_timer(job)


def close_entry(job: Job, restored: bool) -> None:
    """Only a restorer that saw its unit back (active, healthy) drops the entry; a failed restore leaves the
    stop owed, noted as tried, for the next restorer or job on the service. A stop not owed is dropped."""
    unit = job.status["service"]["unit"]
    if restored and not (job.status["service"].get("healthy") and job.status["service"].get("now") == "active"):
        ledger.note(job.paths.root, unit, job.paths.job_id, restore_failed_at=time.time())
        return
    ledger.clear(job.paths.root, unit, job.paths.job_id)


def bring_back_alone(job: Job, unit: str) -> None:
    """One of the job's services alone (`restore-service`), its entry cleared once back; the others stay owed."""
    for view in services.views(job):
        if view.status["service"]["unit"] == unit and owes(view):
            bring_back(view)
            view.save(service=dict(view.status["service"], restored_alone=True))
            close_entry(view, True)


def final_state(job: Job, ending) -> tuple:
    """SUCCEEDED only if the payload exited 0 and every service we stopped is back healthy (or handed over)."""
    down = [r["unit"] for r in services.records(job.status)
            if stopped_by_us(r) and not r.get("healthy") and not r.get("handed_to")]
    service_back = not down
    note = "" if service_back else "; the service %s did not come back healthy" % ", ".join(down)
    if ending is not None:
        return ending[0], ending[1] + note
    if job.status.get("exit_code") == 0:
        return ("SUCCEEDED", "payload exited 0") if service_back else ("FAILED", "payload exited 0" + note)
    return "FAILED", "payload exited with code %s%s" % (job.status.get("exit_code"), note)


def settle_as_restorer(job: Job, message: str) -> None:
    """Settle a job whose supervisor is gone: a decided or terminal state kept, else FAILED."""
    if job.terminal and job.status.get("restored"):
        return
    ending = job.status.get("ending")
    state = job.status["state"] if job.terminal else (ending or {}).get("state", "FAILED")
    job.note_restore(message)
    settle(job, (state, message), ended_at=job.status.get("ended_at"))
