"""PID 1 as the last line: where the host has systemd, the job's supervisor runs in a transient unit
(runner-job-<id>.service: `_run`, answering `start` through ready.fifo).

The unit holds the guarantee past our own processes: any exit of the supervisor (SIGKILL, OOM, the watchdog,
RuntimeMaxSec=) stops the unit, systemd kills what is left of its cgroup (setsid'd payloads included) and then
runs ExecStopPost=`supervisor.py restore`, with no controller call. A supervisor frozen as a whole stops
pinging the watchdog (a thread: a main thread in a bounded wait still pings) and is killed after WATCHDOG_S.
Where systemd-run is missing or fails (or ROOT/launch-fork exists), `start` falls back to the fork + guard
path; status.json's `launch` says which ran, events.jsonl why. RuntimeMaxSec= and TimeoutStopSec= are the
job's recorded budget (budget.py).
"""
from __future__ import annotations

import os
import shlex
import shutil
import socket
import threading
import time

from ..host.answer import Fail
from ..host.bundle import RUN_SUPERVISOR
from ..host.processes import run_command
from ..host.systemd import Systemd
from .budget import recorded
from .files import JobPaths, append_line, read_status, try_unlink

UNIT_PREFIX = "runner-job-"
WATCHDOG_S = 30              # a supervisor that stops pinging this long is hung (frozen): systemd kills the unit
SYSTEMD_RUN_TIMEOUT_S = 20.0
FORK_MARKER = "launch-fork"  # ROOT/launch-fork: use the fork + guard path even where systemd-run works
SKIP_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "INVOCATION_ID", "LISTEN_FDS", "LISTEN_PID",
            "SSH_AUTH_SOCK", "SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY")


def unit_name(job_id: str) -> str:
    return UNIT_PREFIX + job_id + ".service"  # a job id's characters are all valid in a unit name (contract)


def run_argv(ctl: Systemd, paths: JobPaths, bounds: dict, fifo: str, queue: bool) -> list:
    """systemd-run for `_run`; bounds: the job's recorded budget (its hard deadline and each stop phase's)."""
    restore = RUN_SUPERVISOR + ["restore", "--job-id", paths.job_id, "--root", paths.root]
    props = ["KillMode=control-group", "RuntimeMaxSec=%d" % bounds["runtime_max_s"],
             "TimeoutStopSec=%d" % bounds["timeout_stop_s"], "WatchdogSec=%d" % WATCHDOG_S, "NotifyAccess=main",
             "StandardOutput=append:" + paths.supervisor_log, "StandardError=append:" + paths.supervisor_log,
             "ExecStopPost=" + " ".join(shlex.quote(a) for a in restore)]
    ids = ["--uid=%d" % os.getuid(), "--gid=%d" % os.getgid()] if ctl.sudo else []  # run as the login, not root
    env = ["--setenv=%s=%s" % (k, v) for k, v in sorted(os.environ.items()) if k not in SKIP_ENV and "=" not in k]
    return ctl.argv("systemd-run", "--unit=" + unit_name(paths.job_id), "--collect", "--quiet",
                    "--working-directory=" + os.getcwd(), *ids, *env, *["--property=" + p for p in props],
                    *RUN_SUPERVISOR, "_run", "--job-id", paths.job_id, "--root", paths.root,
                    "--ready-fifo", fifo, *(["--queue"] if queue else []))


def launch(paths: JobPaths, spec: dict, queue: bool):
    """Start `_run` in runner-job-<id>.service: its handshake fifo's read end, or None (fork instead)."""
    service = spec["service"]
    if service.get("manager") != "systemd" or shutil.which("systemd-run") is None:
        return None
    if os.path.exists(os.path.join(paths.root, FORK_MARKER)):
        append_line(paths.events, {"t": time.time(), "event": "launch", "mode": "fork",
                                   "message": "ROOT/%s asks for the fork + guard path" % FORK_MARKER})
        return None
    fifo = os.path.join(paths.dir, "ready.fifo")
    os.mkfifo(fifo, 0o600)
    fd = os.open(fifo, os.O_RDWR)  # a reader from now on: the supervisor's open never blocks, never fails
    try:
        argv = run_argv(Systemd(service["scope"], service["sudo"]), paths, recorded(spec, read_status(paths)), fifo,
                        queue)
        done = run_command(argv, timeout=SYSTEMD_RUN_TIMEOUT_S)
        why = "" if done.returncode == 0 else done.stderr.decode("utf-8", "replace").strip()[-300:]
    except Fail as exc:
        why = str(exc)
    if not why:
        return fd
    os.close(fd)
    try_unlink(fifo)
    append_line(paths.events, {"t": time.time(), "event": "launch", "mode": "fork",
                               "message": "systemd-run failed, the supervisor is forked instead: " + why})
    return None


def open_ready(fifo: str) -> int:
    """The supervisor's end of the handshake; a closed pipe when `start` is gone (the answer then fails)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        try_unlink(fifo)  # both ends are open now; nothing else in the job dir is a fifo
        return fd
    except OSError:
        read_end, write_end = os.pipe()
        os.close(read_end)
        return write_end


def launch_record(job_id: str) -> dict:
    """For status.json: which path started this supervisor."""
    unit = unit_name(job_id)
    try:
        with open("/proc/self/cgroup") as fh:
            inside = any(line.rstrip("\n").endswith("/" + unit) for line in fh)
    except OSError:
        inside = False
    return {"mode": "systemd-unit", "unit": unit} if inside else {"mode": "fork"}


def start_watchdog() -> None:
    """Ping systemd's watchdog from a thread while this process is scheduled at all (only inside the unit)."""
    address, usec = os.environ.get("NOTIFY_SOCKET"), os.environ.get("WATCHDOG_USEC")
    if not address or not usec or os.environ.get("WATCHDOG_PID", str(os.getpid())) != str(os.getpid()):
        return
    for name in SKIP_ENV[:3]:  # the guard and the payload must not ping for us
        os.environ.pop(name, None)
    if address.startswith("@"):
        address = "\0" + address[1:]
    interval = int(usec) / 1e6 / 3

    def ping():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        while True:
            try:
                sock.sendto(b"WATCHDOG=1", address)
            except OSError:
                pass  # systemd restarting: the next ping may reach it
            time.sleep(interval)

    threading.Thread(target=ping, name="watchdog", daemon=True).start()
