#!/usr/bin/env python3
"""The host side of runner: one stdlib-only script, one JSON line per call (docs/protocol.md is binding).

Public subcommands: preflight, start, status, logs, cancel, restore, service-restore, result.
Internal ones: _run (the detached supervisor of one job) and _guard (watches the supervisor; restores the
service if the supervisor dies without doing it).

    start ──fork/setsid/fork/exec──▶ _run (supervisor) ──fork/setsid/exec──▶ _guard
      ◀──── one JSON line over the readiness pipe ───┘        holds the read end of the "life" pipe and the
                                                                lock fds; EOF = the supervisor is gone

Process ids are trusted only together with their start time (/proc/PID/stat field 22), so a reused pid is
never taken for the job. Runs on Python >= 3.8 and never imports the controller.
"""
from __future__ import annotations

import argparse
import base64
import errno
import fcntl
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

SCHEMA = 1
STATES = ["QUEUED", "STOPPING_SERVICE", "DRAINING", "RUNNING", "TERMINATING", "RESTORING",
          "SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "LOST"]
TERMINAL = frozenset(["SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "LOST"])
# systemd ActiveStates in which the service is (or is becoming) up: stopping it means restoring it later.
RUNNING_SERVICE_STATES = frozenset(["active", "activating", "reloading"])

JOB_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
UNIT_RE = re.compile(r"[A-Za-z0-9:_.\\@-]+")
UNIT_SUFFIXES = (".service", ".socket", ".target", ".timer", ".mount", ".automount", ".path", ".scope",
                 ".slice", ".device", ".swap")
ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DEVICE_RE = re.compile(r"[A-Za-z0-9-]{1,128}")
NOT_A_NUMBER = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", "")

RESERVE_BYTES = 256 << 10   # given back when the disk fills, so the final status and restore log still fit
READY_TIMEOUT_S = 30.0       # how long `start` waits for the detached supervisor's handshake
START_GRACE_S = 60.0         # a status with no supervisor recorded yet is "starting" this long
POLL_S = 0.1
GPU_POLL_S = 0.5
LOCK_POLL_S = 0.5
LOCK_SETTLE_S = 1.0          # how long a busy lock with no live holder recorded is retried before "busy"
KILL_CONFIRM_S = 10.0        # after SIGKILL, how long to wait for the group to vanish
LOG_MAX_BYTES = 4 << 20
CMD_TIMEOUT_S = 120.0
SETTLE_S = 2.0               # without a health URL, how long a unit must stay active to count as healthy
SUDO_HINT = ("sudo asks for a password; add a NOPASSWD sudoers rule for systemctl (and systemd-run), e.g. "
             "'USER ALL=(root) NOPASSWD: /usr/bin/systemctl, /usr/bin/systemd-run' via visudo -f "
             "/etc/sudoers.d/runner")


class Fail(Exception):
    """An answer `{"ok": false, "error": code, "message": …}`; extra fields ride along."""

    def __init__(self, code: str, message: str, **extra) -> None:
        super().__init__(message)
        self.code = code
        self.extra = extra

    def answer(self) -> dict:
        return dict({"ok": False, "error": self.code, "message": str(self)}, **self.extra)


class Interrupted(Exception):
    """A cancel or a signal stopped the job before its payload finished; carries the final state."""

    def __init__(self, state: str, message: str) -> None:
        super().__init__(message)
        self.state = state


# ── paths ─────────────────────────────────────────────────────────────────────────────────────────────

HERE = os.path.dirname(os.path.abspath(__file__))


class JobPaths:
    """The one place job paths are built (layout: docs/protocol.md)."""

    def __init__(self, root: str, job_id: str) -> None:
        self.root = root
        self.job_id = job_id
        self.dir = os.path.join(root, "jobs", job_id)
        self.spec = os.path.join(self.dir, "spec.json")
        self.status = os.path.join(self.dir, "status.json")
        self.events = os.path.join(self.dir, "events.jsonl")
        self.output = os.path.join(self.dir, "output.log")
        self.result = os.path.join(self.dir, "result.json")
        self.restore_log = os.path.join(self.dir, "restore.log")
        self.cancel = os.path.join(self.dir, "cancel")
        self.supervisor_log = os.path.join(self.dir, "supervisor.log")
        self.reserve = os.path.join(self.dir, "reserve")
        self.restore_lock = os.path.join(self.dir, "restore.lock")


def locks_dir(root: str) -> str:
    return os.path.join(root, "locks")


# ── atomic io ─────────────────────────────────────────────────────────────────────────────────────────

def write_json_atomic(path: str, obj) -> None:
    """Temp file in the same dir, fsync, rename, fsync the dir: a reader sees the old or the new file."""
    data = (json.dumps(obj, sort_keys=True) + "\n").encode("utf-8")
    tmp = "%s.tmp.%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)  # never publish a half-written file
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json(path: str):
    with open(path, "rb") as fh:
        return json.loads(fh.read().decode("utf-8"))


def append_line(path: str, obj) -> None:
    with open(path, "ab") as fh:
        fh.write((json.dumps(obj, sort_keys=True) + "\n").encode("utf-8"))


def append_text(path: str, text: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("%s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), text))


# ── proc identity ─────────────────────────────────────────────────────────────────────────────────────

def proc_stat(pid: int):
    """Fields after the `(comm)` of /proc/PID/stat (field 3 first), or None when the process is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    return text.rsplit(")", 1)[1].split()


def start_time(pid: int):
    fields = proc_stat(pid)
    return int(fields[19]) if fields else None  # field 22: starttime, in clock ticks since boot


def identity(pid: int) -> dict:
    return {"pid": pid, "start_time": start_time(pid)}


def is_alive(ident) -> bool:
    """The recorded process still runs: same pid, same start time, not a zombie."""
    if not ident or not ident.get("pid"):
        return False
    fields = proc_stat(int(ident["pid"]))
    return bool(fields) and fields[0] != "Z" and int(fields[19]) == ident.get("start_time")


def group_members(pgid: int) -> list:
    """Live (non-zombie) processes whose process group is pgid."""
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = proc_stat(int(name))
            if fields and fields[0] != "Z" and int(fields[2]) == pgid:
                members.append(int(name))
    return members


def group_is_ours(payload: dict) -> bool:
    """The group id is the leader's pid; if a process with that pid lives, it must be our leader."""
    fields = proc_stat(int(payload["pgid"]))
    return fields is None or fields[0] == "Z" or int(fields[19]) == payload.get("start_time")


# ── parsers (pure) ────────────────────────────────────────────────────────────────────────────────────

def parse_mib(text: str):
    """An nvidia-smi memory cell in MiB; None for "[N/A]", "[Not Supported]" and the like."""
    text = text.strip()
    if text in NOT_A_NUMBER:
        return None
    try:
        return int(float(text))
    except ValueError:  # other bracketed words, e.g. "[Insufficient Permissions]" inside some containers
        return None


def parse_gpu_csv(text: str) -> list:
    """`--query-gpu=index,uuid,name,memory.total,memory.used,memory.free --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = line.split(",")
        if len(cells) < 6:
            raise ValueError("nvidia-smi line has %d fields, expected 6: %r" % (len(cells), line))
        total, used, free = (parse_mib(c) for c in cells[-3:])
        if free is None and total is not None and used is not None:
            free = total - used
        gpus.append({"index": cells[0].strip(), "uuid": cells[1].strip(), "name": ",".join(cells[2:-3]).strip(),
                     "total_mib": total, "used_mib": used, "free_mib": free})
    return gpus


def parse_apps_csv(text: str) -> list:
    """`--query-compute-apps=pid,used_memory --format=csv,noheader,nounits`."""
    apps = []
    for line in text.splitlines():
        if line.strip():
            pid, mib = line.split(",", 1)
            apps.append({"pid": int(pid.strip()), "used_mib": parse_mib(mib)})
    return apps


def parse_systemctl_show(text: str) -> dict:
    """`systemctl show --property=ActiveState,SubState,MainPID UNIT`: KEY=VALUE lines (any order)."""
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    main_pid = values.get("MainPID", "0").strip()
    return {"active_state": values.get("ActiveState", "").strip() or "unknown",
            "sub_state": values.get("SubState", "").strip() or "unknown",
            "main_pid": int(main_pid) if main_pid.isdigit() else 0}


def sudo_wants_password(returncode: int, stderr: str) -> bool:
    return "password is required" in stderr or (returncode == 1 and stderr.lstrip().startswith("sudo:"))


def select_gpus(gpus: list, devices: list) -> list:
    """The spec's devices, by index or UUID, in spec order; a device the host lacks is a clear error."""
    by_key = {g["index"]: g for g in gpus}
    by_key.update({g["uuid"]: g for g in gpus})
    missing = [d for d in devices if d not in by_key]
    if missing:
        have = ", ".join("%s (%s)" % (g["index"], g["uuid"]) for g in gpus) or "no GPUs"
        raise Fail("bad-spec", "GPU %s not found on this host; it has: %s" % (", ".join(missing), have))
    return [by_key[d] for d in devices]


def short_gpus(gpus: list, required_mib: int) -> list:
    """GPUs with less free memory than required (unknown free memory counts as short)."""
    return [g for g in gpus if g["free_mib"] is None or g["free_mib"] < required_mib]


def describe_apps(apps: list) -> str:
    if not apps:
        return "no compute process is listed by nvidia-smi"
    return ", ".join("pid %d (%s MiB)" % (a["pid"], a["used_mib"] if a["used_mib"] is not None else "?")
                     for a in apps)


# ── spec validation ───────────────────────────────────────────────────────────────────────────────────

def check_job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id) or job_id in (".", ".."):
        raise Fail("bad-args", "invalid job id %r: use 1-128 of [A-Za-z0-9._-], not '.' or '..'" % (job_id,))
    return job_id


def check_unit(unit) -> str:
    """systemd's unit-name characters; no leading '-' (it would read as an option); `.service` by default."""
    if not isinstance(unit, str) or not UNIT_RE.fullmatch(unit) or unit.startswith("-") or len(unit) > 250:
        raise Fail("bad-spec", "invalid systemd unit name %r" % (unit,))
    return unit if unit.endswith(UNIT_SUFFIXES) else unit + ".service"


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise Fail("bad-spec", message)


def _number(value, field: str, minimum: float = 0.0) -> float:
    _need(isinstance(value, (int, float)) and not isinstance(value, bool) and value >= minimum,
          "%s must be a number >= %s, got %r" % (field, minimum, value))
    return float(value)


def _text(value, field: str) -> str:
    _need(isinstance(value, str) and value != "" and "\0" not in value, "%s must be a non-empty string" % field)
    return value


def check_service(raw) -> dict:
    _need(isinstance(raw, dict), "service must be an object")
    manager = raw.get("manager", "none")
    if manager == "none":
        return {"manager": "none"}
    _need(manager == "systemd", "service.manager must be systemd or none, got %r" % (manager,))
    scope, stop, url = raw.get("scope", "system"), raw.get("stop", "if-needed"), raw.get("health_url")
    _need(scope in ("system", "user"), "service.scope must be system or user")
    _need(stop in ("always", "if-needed", "never"), "service.stop must be always, if-needed or never")
    _need(url is None or (isinstance(url, str) and re.match(r"https?://[^\s]+$", url) is not None),
          "service.health_url must be an http(s) URL")
    _need(isinstance(raw.get("sudo", False), bool), "service.sudo must be true or false")
    return {"manager": "systemd", "unit": check_unit(raw.get("unit")), "scope": scope, "stop": stop,
            "health_url": url, "health_timeout": _number(raw.get("health_timeout", 900.0), "service.health_timeout"),
            "sudo": raw.get("sudo", False)}


def check_gpu(raw) -> dict:
    raw = raw or {}
    _need(isinstance(raw, dict), "gpu must be an object")
    devices = [str(d) for d in raw.get("devices", [])]
    for device in devices:
        _need(DEVICE_RE.fullmatch(device) is not None, "invalid GPU device %r (an index or a UUID)" % device)
    required = raw.get("required_mib", 0)
    _need(isinstance(required, int) and not isinstance(required, bool) and required >= 0,
          "gpu.required_mib must be an integer >= 0")
    return {"devices": devices, "required_mib": required,
            "drain_timeout": _number(raw.get("drain_timeout", 120.0), "gpu.drain_timeout")}


def check_script(script) -> str:
    """A relative path inside the uploaded payload dir: no absolute path, no `..`, no empty part."""
    _text(script, "payload.script")
    parts = script.split("/")
    _need(not script.startswith("/") and all(p not in ("", ".", "..") for p in parts),
          "payload.script must be a relative path inside the payload dir, got %r" % script)
    _need(os.path.isfile(os.path.join(HERE, script)), "payload.script %r is not in the uploaded payload" % script)
    return script


def check_payload(raw) -> dict:
    _need(isinstance(raw, dict), "payload must be an object")
    script, command = raw.get("script"), raw.get("command")
    _need((script is None) != (command is None), "payload needs exactly one of script and command")
    env = raw.get("env") or {}
    _need(isinstance(env, dict), "payload.env must be an object")
    for key, value in env.items():
        _need(ENV_KEY_RE.fullmatch(key) is not None, "invalid environment variable name %r" % (key,))
        _need(isinstance(value, str) and "\0" not in value, "payload.env.%s must be a string without NUL" % key)
    args = raw.get("args") or []
    _need(isinstance(args, list) and all(isinstance(a, str) and "\0" not in a for a in args),
          "payload.args must be a list of strings")
    if command is not None:
        _need(isinstance(command, list) and command and all(isinstance(a, str) and "\0" not in a for a in command),
              "payload.command must be a non-empty list of strings")
        return {"command": list(command), "script": None, "python": None, "args": [], "env": dict(env)}
    return {"command": None, "script": check_script(script), "python": _text(raw.get("python", "python3"),
            "payload.python"), "args": list(args), "env": dict(env)}


def check_spec(raw, job_id=None) -> dict:
    """The normalised spec; job_id (from argv) must agree with the spec's own when both are given."""
    _need(isinstance(raw, dict), "the spec must be a JSON object")
    if job_id is None:
        job_id = raw.get("job_id") or "preflight"
    _need(raw.get("job_id", job_id) == job_id, "spec job_id %r differs from --job-id" % (raw.get("job_id"),))
    limits = raw.get("limits") or {}
    _need(isinstance(limits, dict), "limits must be an object")
    name = raw.get("name", job_id)
    _need(isinstance(name, str) and len(name) <= 1000, "name must be a string")
    return {"name": name, "job_id": job_id, "service": check_service(raw.get("service") or {"manager": "none"}),
            "gpu": check_gpu(raw.get("gpu")), "payload": check_payload(raw.get("payload")),
            "limits": {"max_runtime": _number(limits.get("max_runtime", 1800.0), "limits.max_runtime", 0.001),
                       "grace": _number(limits.get("grace", 30.0), "limits.grace")}}


def read_spec_stdin(job_id=None) -> dict:
    try:
        raw = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    except ValueError as exc:
        raise Fail("bad-spec", "stdin is not a JSON spec: %s" % exc)
    return check_spec(raw, job_id)


# ── systemd ───────────────────────────────────────────────────────────────────────────────────────────

def run_command(argv: list, timeout: float = CMD_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run argv (never a shell); sudo wanting a password becomes `sudo-password`."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except FileNotFoundError:
        raise Fail("internal", "%s is not installed on this host" % argv[0])
    except subprocess.TimeoutExpired:
        raise Fail("timeout", "%s did not finish within %.0f s" % (" ".join(argv[:4]), timeout))
    stderr = done.stderr.decode("utf-8", "replace")
    if os.path.basename(argv[0]) == "sudo" and sudo_wants_password(done.returncode, stderr):
        raise Fail("sudo-password", SUDO_HINT)
    return done


class Systemd:
    """systemctl/systemd-run/journalctl argv for one scope. With sudo, every call goes through `sudo -n`:
    a login that may not manage the unit often cannot even read its state (no system bus access)."""

    def __init__(self, scope: str = "system", sudo: bool = False) -> None:
        self.user = ["--user"] if scope == "user" else []
        self.sudo = ["sudo", "-n"] if sudo else []

    def argv(self, tool: str, *args: str) -> list:
        return self.sudo + [tool] + self.user + list(args)

    def show(self, unit: str) -> dict:
        done = run_command(self.argv("systemctl", "show", "--property=ActiveState,SubState,MainPID", unit))
        if done.returncode != 0:
            raise Fail("internal", "cannot read the state of %s: %s" % (
                unit, done.stderr.decode("utf-8", "replace").strip()[-300:]))
        return parse_systemctl_show(done.stdout.decode("utf-8", "replace"))

    def is_active(self, unit: str) -> str:
        done = run_command(self.argv("systemctl", "is-active", unit))
        return done.stdout.decode("utf-8", "replace").strip() or "unknown"

    def change(self, verb: str, unit: str, *flags: str, timeout: float = CMD_TIMEOUT_S) -> None:
        done = run_command(self.argv("systemctl", verb, *flags, unit), timeout=timeout)
        if done.returncode != 0:
            raise Fail("internal", "systemctl %s %s failed (exit %d): %s" % (
                verb, unit, done.returncode, done.stderr.decode("utf-8", "replace").strip()[-500:]))

    def timer_argv(self, unit: str, seconds: float, command: list) -> list:
        # AccuracySec: systemd otherwise may fire a timer up to a minute late.
        return self.argv("systemd-run", "--on-active=%ds" % int(seconds), "--timer-property=AccuracySec=1s",
                         "--unit=" + unit, *command)

    def log_tail(self, unit: str, lines: int = 20) -> str:
        """The unit's last log lines; without a journal, say so and show `systemctl status` instead."""
        try:
            done = run_command(self.argv("journalctl", "-u", unit, "-n", str(lines), "--no-pager"), timeout=20)
            text = done.stdout.decode("utf-8", "replace").strip()
            if done.returncode == 0 and text and "No entries" not in text:
                return text
            why = "journalctl has no entries for %s" % unit
        except Fail as exc:
            why = str(exc)
        done = run_command(self.argv("systemctl", "status", "--no-pager", "-n", str(lines), unit), timeout=20)
        return "%s; systemctl status says:\n%s" % (why, done.stdout.decode("utf-8", "replace").strip())


def start_unit(ctl: Systemd, unit: str, timeout: float) -> str:
    """`systemctl start`, bounded; returns "" or why it did not finish (the unit's state then tells the rest).
    A start cut short by the timeout goes on inside systemd; only the wait for it ends."""
    try:
        ctl.change("start", unit, timeout=max(0.5, timeout))
        return ""
    except Fail as exc:
        if exc.code == "sudo-password":
            raise
        return str(exc)


def health_ok(url: str, timeout: float) -> bool:
    """True when url answers 2xx. Proxies from the environment are ignored: health URLs are local."""
    import urllib.error  # here, not at the top: it is most of the script's import time, paid on every call
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=min(5.0, max(0.2, timeout))) as answer:
            return 200 <= answer.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_healthy(ctl: Systemd, unit: str, url, timeout: float):
    """Poll until healthy, failed or timeout; returns (healthy, active_state). Healthy: active and the
    health URL answers 2xx; with no URL, active for SETTLE_S in a row (a Type=simple unit is "active" the
    moment its process is forked, even one that dies a second later)."""
    deadline = time.monotonic() + timeout
    active_since = None
    while True:
        state = ctl.is_active(unit)
        now = time.monotonic()
        active_since = (active_since or now) if state == "active" else None
        if active_since is not None and (health_ok(url, deadline - now) if url else now - active_since >= SETTLE_S):
            return True, state
        if state == "failed" or now >= deadline:
            return False, state
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


# ── gpu ───────────────────────────────────────────────────────────────────────────────────────────────

GPU_QUERY = ["--query-gpu=index,uuid,name,memory.total,memory.used,memory.free", "--format=csv,noheader,nounits"]
APPS_QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]


def nvidia_smi(args: list) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise Fail("internal", "nvidia-smi is not on PATH, but the job asks for GPUs")
    done = run_command([exe] + args, timeout=60)
    if done.returncode != 0:
        raise Fail("internal", "nvidia-smi failed (exit %d): %s" % (
            done.returncode, done.stderr.decode("utf-8", "replace").strip()[-300:]))
    return done.stdout.decode("utf-8", "replace")


def query_gpus(devices: list) -> list:
    return select_gpus(parse_gpu_csv(nvidia_smi(GPU_QUERY)), devices)


def query_apps() -> list:
    return parse_apps_csv(nvidia_smi(APPS_QUERY))


# ── locks ─────────────────────────────────────────────────────────────────────────────────────────────

def lock_keys(spec: dict) -> list:
    """`service-<unit>` when a systemd service is involved, `gpu-<device>` per device; none for CPU jobs."""
    keys = ["gpu-" + d for d in gpu_lock_names(spec["gpu"]["devices"])]
    if spec["service"]["manager"] == "systemd":
        keys.append("service-" + spec["service"]["unit"])
    return sorted(set(keys))


def gpu_lock_names(devices: list) -> list:
    """One name per card however the spec names it (index or UUID): its index, as nvidia-smi reports it."""
    if not devices:
        return []
    try:
        return [str(g["index"]) for g in query_gpus(devices)]
    except (Fail, ValueError):
        return list(devices)  # the drain step reports the GPU problem with its own message


def read_holder(root: str, key: str):
    try:
        holder = read_json(os.path.join(locks_dir(root), key + ".json"))
    except (OSError, ValueError):
        return None
    return dict(holder, key=key) if isinstance(holder, dict) else None


def probe_lock(root: str, key: str) -> dict:
    """Whether a lock is held now, without keeping it."""
    path = os.path.join(locks_dir(root), key + ".lock")
    if not os.path.exists(path):
        return {"key": key, "held": False, "holder": None}
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: two probes never make each other "busy"
        return {"key": key, "held": False, "holder": None}
    except BlockingIOError:
        return {"key": key, "held": True, "holder": read_holder(root, key)}
    finally:
        os.close(fd)


class Locks:
    """flock files under ROOT/locks; all or nothing (so two queued jobs never hold one lock each)."""

    def __init__(self, root: str, keys: list, job_id: str) -> None:
        self.root, self.keys, self.job_id = root, keys, job_id
        self.fds = {}
        self.held = False

    def open(self) -> None:
        os.makedirs(locks_dir(self.root), exist_ok=True)
        for key in self.keys:
            self.fds[key] = os.open(os.path.join(locks_dir(self.root), key + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)

    def try_acquire(self):
        """Take every lock or none. Returns the holder of the first busy one, or None when all are ours.
        A lock that is busy with no live holder recorded is a probe or a starter that has not written its
        holder yet: try again for a moment rather than answer "busy" naming nobody."""
        deadline = time.monotonic() + LOCK_SETTLE_S
        while True:
            holder = self._try_all()
            if holder is None or pid_exists(holder.get("pid")) or time.monotonic() >= deadline:
                return holder
            time.sleep(0.05)

    def _try_all(self):
        taken = []
        for key in self.keys:
            try:
                fcntl.flock(self.fds[key], fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                for done in taken:
                    fcntl.flock(self.fds[done], fcntl.LOCK_UN)
                return read_holder(self.root, key) or {"key": key}
            taken.append(key)
        self.held = True
        return None

    def write_holders(self) -> None:
        for key in self.keys:
            write_json_atomic(os.path.join(locks_dir(self.root), key + ".json"),
                              {"job_id": self.job_id, "pid": os.getpid(), "since": time.time()})

    def release(self) -> None:
        """LOCK_UN releases the lock for every fd sharing the open file (the guard's copies too)."""
        if not self.held:
            return
        for key in self.keys:
            holder = read_holder(self.root, key)
            if holder and holder.get("job_id") == self.job_id:
                try_unlink(os.path.join(locks_dir(self.root), key + ".json"))
            fcntl.flock(self.fds[key], fcntl.LOCK_UN)
        self.held = False


def pid_exists(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def try_unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


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
        self.ctl = Systemd(spec["service"].get("scope", "system"), spec["service"].get("sudo", False))
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


def release_reserve(paths: JobPaths) -> bool:
    try:
        os.unlink(paths.reserve)
        return True
    except OSError:
        return False


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


def should_stop(job: Job) -> bool:
    policy = job.spec["service"]["stop"]
    if policy != "if-needed":
        return policy == "always"
    gpu = job.spec["gpu"]
    if not gpu["devices"]:
        return False
    gpus = query_gpus(gpu["devices"])
    job.save(gpu=dict(job.status["gpu"], before=gpus))
    return bool(short_gpus(gpus, gpu["required_mib"]))


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
    command = [sys.executable, os.path.abspath(__file__), "restore", "--job-id", job.paths.job_id,
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


def kill_group(pgid: int, grace: float, proc=None) -> None:
    """TERM the whole group, give it `grace`, then KILL what is left and wait for it to vanish."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_CONFIRM_S)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc is not None:
                proc.poll()  # reap our own child so it does not linger as a zombie
            if not group_members(pgid):
                return
            time.sleep(POLL_S)


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


def restore_service(job: Job) -> None:
    """Start the service again if it ran before and we stopped it; wait until it is healthy."""
    service = job.status["service"]
    if service["manager"] != "systemd" or service.get("was") is None:
        return
    if not service.get("stopped") or service.get("was") not in RUNNING_SERVICE_STATES:
        observe_service(job)
        return
    unit, spec_service = service["unit"], job.spec["service"]
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


def observe_service(job: Job) -> None:
    """Record how a service we did not stop looks at the end (one probe, no waiting)."""
    service, url = job.status["service"], job.spec["service"]["health_url"]
    try:
        now = job.ctl.is_active(service["unit"])
    except Fail as exc:
        job.event("service", error=str(exc))
        return
    running = service.get("was") in RUNNING_SERVICE_STATES
    healthy = now == "active" and (not url or health_ok(url, 5.0)) if running else None
    job.save(service=dict(service, now=now, healthy=healthy))


def wind_down(job: Job, proc_grace: float) -> None:
    """What every exit path does: kill leftovers, wait for GPU memory, restore the service."""
    if not job.terminal:
        job.set_state("RESTORING", "restoring the host")
    for step in (lambda: kill_leftovers(job, proc_grace), lambda: wait_gpu_release(job)):
        try:
            step()
        except Exception as exc:  # nothing before the restore may keep the service down
            job.event("wind-down", error="%s: %s" % (type(exc).__name__, exc))
    restore_service(job)


def kill_leftovers(job: Job, proc_grace: float) -> None:
    payload = job.status.get("payload")
    if payload and group_is_ours(payload):
        job.payload_pids.update(group_members(int(payload["pgid"])))
        kill_group(int(payload["pgid"]), proc_grace)


def final_state(job: Job, ending) -> tuple:
    """SUCCEEDED only if the payload exited 0 and the service (when we stopped it) is back healthy."""
    service = job.status["service"]
    we_stopped_it = service.get("stopped") and service.get("was") in RUNNING_SERVICE_STATES
    service_back = not we_stopped_it or service.get("healthy")
    note = "" if service_back else "; the service %s did not come back healthy" % service.get("unit")
    if ending is not None:
        return ending[0], ending[1] + note
    if job.status.get("exit_code") == 0:
        return ("SUCCEEDED", "payload exited 0") if service_back else ("FAILED", "payload exited 0" + note)
    return "FAILED", "payload exited with code %s%s" % (job.status.get("exit_code"), note)


def finish(job: Job, ending) -> None:
    wind_down(job, job.spec["limits"]["grace"])
    state, message = final_state(job, ending)
    job.set_state(state, "done", message=message, ended_at=time.time(), restored=True)
    stop_guard_timer(job)


def supervise(job: Job, locks: Locks, flags: Flags) -> None:
    """The whole job; `finish` runs on every path out, exceptions included."""
    ending = None
    try:
        if not locks.held:
            wait_for_locks(job, locks, flags)
        locks.write_holders()
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
        finish(job, ending)
        # Only after a finished restore: if finish raised, the guard's inherited lock fds keep the host
        # locked until it has restored the service (LOCK_UN would release its copies too).
        locks.release()


# ── guard ─────────────────────────────────────────────────────────────────────────────────────────────

def start_guard(job: Job, locks: Locks) -> None:
    """Fork the guard: it holds the lock fds and the read end of a pipe only the supervisor can write to.
    The write end stays open, unused, until the supervisor exits however it exits: that EOF wakes the guard."""
    life_r, life_w = os.pipe()
    keep = [life_r] + list(locks.fds.values())
    argv = [sys.executable, os.path.abspath(__file__), "_guard", "--job-id", job.paths.job_id,
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


def recover(job: Job, message: str) -> None:
    """After the supervisor is gone: finish what it left, keep a decided end state, else FAILED."""
    if job.terminal and job.status.get("restored"):
        return
    grace = job.spec["limits"]["grace"]
    ending = job.status.get("ending")
    state = job.status["state"] if job.terminal else (ending or {}).get("state", "FAILED")
    job.note_restore(message)
    wind_down(job, grace)
    job.set_state(state, "done", message=message, ended_at=job.status.get("ended_at") or time.time(), restored=True)
    stop_guard_timer(job)


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


def cmd_guard(args) -> dict:
    for sig in (signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    while os.read(args.life_fd, 1):
        pass  # the supervisor never writes; a read returns only at EOF
    paths = JobPaths(args.root, args.job_id)
    if not os.path.isdir(paths.dir):
        return {"ok": True}
    job = Job.load(paths)
    with_restore_lock(job, lambda: recover(job, "supervisor died (SIGKILL?); guard restored the service"))
    return {"ok": True, "state": job.status["state"]}


# ── commands ──────────────────────────────────────────────────────────────────────────────────────────

def read_status(paths: JobPaths) -> dict:
    try:
        status = read_json(paths.status)
        if not isinstance(status, dict) or "state" not in status:
            raise ValueError("not a status object")
        return status
    except (OSError, ValueError) as exc:
        raise Fail("bad-status", "cannot read %s: %s" % (paths.status, exc), job_id=paths.job_id)


def job_paths(args) -> JobPaths:
    paths = JobPaths(args.root, check_job_id(args.job_id))
    if not os.path.isdir(paths.dir):
        raise Fail("unknown-job", "no job %s on this host" % args.job_id, job_id=args.job_id)
    return paths


def close_fds_except(keep: list) -> None:
    """Close every fd above 2 but `keep`, so nothing the caller (e.g. sshd) opened stays open."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2 and int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:
                pass  # the fd listdir itself used, already closed


def daemonize_exec(argv: list, log_path: str, keep: list = ()) -> None:
    """fork, setsid, fork, exec argv with stdin /dev/null and stdout+stderr appended to log_path."""
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        close_fds_except(keep)
        for fd in keep:
            os.set_inheritable(fd, True)
        os.execv(sys.executable, argv)
    finally:
        os._exit(127)


def read_ready(fd: int, timeout: float):
    """The supervisor's one-line handshake; None on EOF or timeout."""
    data, deadline = b"", time.monotonic() + timeout
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    try:
        return json.loads(data.decode("utf-8").splitlines()[0])
    except (ValueError, IndexError):
        return None


def tail_file(path: str, limit: int = 2000) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read()[-limit:].decode("utf-8", "replace")
    except OSError:
        return ""


def cmd_start(args) -> dict:
    job_id = check_job_id(args.job_id)
    spec = read_spec_stdin(job_id)
    paths = JobPaths(args.root, job_id)
    claim_job_dir(paths, spec)
    ready_r, ready_w = os.pipe()
    argv = [sys.executable, os.path.abspath(__file__), "_run", "--job-id", job_id, "--root", args.root,
            "--ready-fd", str(ready_w)] + (["--queue"] if args.queue else [])
    daemonize_exec(argv, paths.supervisor_log, keep=[ready_w])
    os.close(ready_w)
    answer = read_ready(ready_r, READY_TIMEOUT_S)
    os.close(ready_r)
    if answer is None:
        return start_failed(paths)
    return answer


def claim_job_dir(paths: JobPaths, spec: dict) -> None:
    """Build the job dir aside, then rename it into place: the rename is the atomic claim of the id, and no
    reader ever sees a job dir without its spec.json and status.json."""
    staging = os.path.join(paths.root, "tmp")
    for path in (os.path.dirname(paths.dir), staging):
        os.makedirs(path, exist_ok=True)
    if os.path.exists(paths.dir):
        raise Fail("exists", "job %s exists on this host" % paths.job_id, job_id=paths.job_id)
    tmp = tempfile.mkdtemp(prefix=paths.job_id + ".", dir=staging)
    write_json_atomic(os.path.join(tmp, "spec.json"), spec)
    write_json_atomic(os.path.join(tmp, "status.json"), initial_status(spec))
    with open(os.path.join(tmp, "reserve"), "wb") as fh:  # real blocks, not a sparse file
        fh.write(b"\0" * RESERVE_BYTES)
    try:
        os.rename(tmp, paths.dir)  # fails when the target exists and is not empty: every job dir has files
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise Fail("exists", "job %s exists on this host" % paths.job_id, job_id=paths.job_id)
    fsync_dir(os.path.dirname(paths.dir))


def start_failed(paths: JobPaths) -> dict:
    log = tail_file(paths.supervisor_log)
    try:
        job = Job.load(paths)
        if job.status.get("supervisor") is None or not is_alive(job.status.get("supervisor")):
            job.set_state("FAILED", "done", message="the supervisor did not start", restored=True, ended_at=time.time())
    except Fail:
        pass
    raise Fail("start-failed", "the supervisor did not report ready within %.0f s; its log: %s"
               % (READY_TIMEOUT_S, log), job_id=paths.job_id)


def send_ready(fd: int, answer: dict) -> None:
    try:
        os.write(fd, (json.dumps(answer) + "\n").encode("utf-8"))
    except OSError:
        pass  # `start` gave up waiting; the job goes on and `status` shows it
    os.close(fd)


def install_signal_handlers(flags: Flags) -> None:
    def stop(signum, frame):
        flags.signal = signum

    def cancel(signum, frame):
        flags.cancel = True

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    signal.signal(signal.SIGUSR1, cancel)


def cmd_run(args) -> dict:
    """The detached supervisor: claim locks, start the guard, answer `start`, then run the job."""
    os.set_inheritable(args.ready_fd, False)  # the guard and the payload must not hold `start`'s pipe
    paths = JobPaths(args.root, args.job_id)
    job = Job.load(paths)
    flags = Flags()
    install_signal_handlers(flags)
    job.save(supervisor=identity(os.getpid()))
    locks = Locks(args.root, lock_keys(job.spec), args.job_id)
    locks.open()
    holder = locks.try_acquire()
    if holder is not None and not args.queue:
        shutil.rmtree(paths.dir, ignore_errors=True)  # refused: the id was never used
        send_ready(args.ready_fd, Fail("busy", "%s is held by job %s (supervisor pid %s)" % (
            holder.get("key"), holder.get("job_id", "?"), holder.get("pid", "?")), holder=holder).answer())
        return {"ok": False, "error": "busy"}
    start_guard(job, locks)
    send_ready(args.ready_fd, {"ok": True, "job_id": args.job_id, "state": job.status["state"],
                               "supervisor_pid": os.getpid(), "job_dir": paths.dir, "queued": holder is not None})
    supervise(job, locks, flags)
    return {"ok": True, "state": job.status["state"]}


def refresh(paths: JobPaths) -> dict:
    """status.json, with a dead job (supervisor and guard both gone) marked LOST and a restore started."""
    status = read_status(paths)
    if status["state"] in TERMINAL or is_alive(status.get("supervisor")) or is_alive(status.get("guard")):
        return status
    if status.get("supervisor") is None and time.time() - status.get("created_at", 0) < START_GRACE_S:
        return status  # `start` is still bringing the supervisor up
    job = Job.load(paths)  # re-read: with both gone nobody writes any more, so this is the last word
    if job.terminal:
        return job.status
    job.set_state("LOST", "supervisor and guard are gone", message="the supervisor and its guard died; "
                  "a restore was started", ending=job.status.get("ending"), ended_at=time.time())
    daemonize_exec([sys.executable, os.path.abspath(__file__), "restore", "--job-id", paths.job_id,
                    "--root", paths.root], paths.restore_log)
    return job.status


def status_entry(paths: JobPaths) -> dict:
    status = refresh(paths)
    return dict(status, supervisor_pid=(status.get("supervisor") or {}).get("pid"))


def cmd_status(args) -> dict:
    jobs_root = os.path.join(args.root, "jobs")
    ids = args.job_id or (sorted(os.listdir(jobs_root)) if os.path.isdir(jobs_root) else [])
    jobs = []
    for job_id in ids:
        paths = JobPaths(args.root, check_job_id(job_id))
        jobs.append(status_entry(paths) if os.path.isdir(paths.dir) else {"job_id": job_id, "state": "UNKNOWN"})
    return {"ok": True, "jobs": jobs}


def read_log_chunk(path: str, offset: int, limit: int) -> tuple:
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(offset)
            return fh.read(min(limit, max(0, size - offset))), size
    except FileNotFoundError:
        return b"", 0


def cmd_logs(args) -> dict:
    paths = job_paths(args)
    if args.offset < 0 or args.max <= 0:
        raise Fail("bad-args", "--offset must be >= 0 and --max > 0")
    deadline = time.monotonic() + max(0.0, args.wait)
    while True:
        status = refresh(paths)  # read the state first: a terminal state then covers every byte read below
        data, size = read_log_chunk(paths.output, args.offset, min(args.max, LOG_MAX_BYTES))
        if args.offset > size:
            raise Fail("bad-offset", "offset %d is past the end of the log (%d bytes)" % (args.offset, size),
                       size=size)
        terminal = status["state"] in TERMINAL
        if data or terminal or time.monotonic() >= deadline:
            return {"ok": True, "offset": args.offset, "next_offset": args.offset + len(data), "size": size,
                    "data_b64": base64.b64encode(data).decode("ascii"), "state": status["state"],
                    "terminal": terminal, "exit_code": status.get("exit_code")}
        time.sleep(POLL_S)


def cmd_cancel(args) -> dict:
    paths = job_paths(args)
    status = refresh(paths)
    if status["state"] in TERMINAL:
        return {"ok": True, "job_id": paths.job_id, "state": status["state"], "already": True}
    with open(paths.cancel, "w") as fh:
        fh.write("%f\n" % time.time())
    supervisor = status.get("supervisor")
    if is_alive(supervisor):
        os.kill(int(supervisor["pid"]), signal.SIGUSR1)
    append_line(paths.events, {"t": time.time(), "event": "cancel-requested"})
    return {"ok": True, "job_id": paths.job_id, "state": status["state"], "already": False}


def cmd_restore(args) -> dict:
    """Idempotent: a restored job is reported as is; a live supervisor or guard is left to do it."""
    paths = job_paths(args)
    job = Job.load(paths)
    answer = {"ok": True, "job_id": paths.job_id}
    if job.status.get("restored"):
        return dict(answer, state=job.status["state"], service=job.status["service"], already=True)
    if is_alive(job.status.get("supervisor")) or is_alive(job.status.get("guard")):
        return dict(answer, state=job.status["state"], service=job.status["service"], deferred=True,
                    message="the job's supervisor (or guard) is alive and restores the service itself")
    message = "supervisor gone; restored by `restore`" if job.status["state"] != "LOST" else job.status["message"]
    done = with_restore_lock(job, lambda: recover(job, message))
    return dict(answer, state=job.status["state"], service=job.status["service"], in_progress=not done)


def cmd_service_restore(args) -> dict:
    unit = check_unit(args.unit)
    if args.health_url and not re.match(r"https?://[^\s]+$", args.health_url):
        raise Fail("bad-args", "--health-url must be an http(s) URL")
    ctl = Systemd(args.scope, args.sudo)
    deadline = time.monotonic() + max(0.0, args.max_wait)
    if ctl.show(unit)["active_state"] not in RUNNING_SERVICE_STATES:
        start_unit(ctl, unit, deadline - time.monotonic())
    healthy, active = wait_healthy(ctl, unit, args.health_url, deadline - time.monotonic())
    shown = ctl.show(unit)
    state = "healthy" if healthy else ("starting" if shown["active_state"] in RUNNING_SERVICE_STATES else "failed")
    answer = {"ok": True, "unit": unit, "state": state, "active_state": shown["active_state"],
              "sub_state": shown["sub_state"], "log_tail": None}
    if state == "failed":
        answer["log_tail"] = ctl.log_tail(unit)
    return answer


def cmd_result(args) -> dict:
    paths = job_paths(args)
    try:
        return {"ok": True, "job_id": paths.job_id, "result": read_json(paths.result)}
    except (OSError, ValueError) as exc:
        raise Fail("no-result", "job %s has no readable result.json: %s" % (paths.job_id, exc), job_id=paths.job_id)


def preflight_gpus(spec: dict) -> dict:
    devices = spec["gpu"]["devices"]
    if not devices:
        return {"gpus": [], "apps": [], "nvidia_smi": shutil.which("nvidia-smi") is not None}
    if shutil.which("nvidia-smi") is None:
        return {"gpus": [], "apps": [], "nvidia_smi": False}
    found = parse_gpu_csv(nvidia_smi(GPU_QUERY))
    wanted = set(devices)
    return {"gpus": [g for g in found if g["index"] in wanted or g["uuid"] in wanted], "apps": query_apps(),
            "nvidia_smi": True}


def cmd_preflight(args) -> dict:
    spec = read_spec_stdin(check_job_id(args.job_id) if args.job_id else None)
    service = None
    if spec["service"]["manager"] == "systemd":
        unit = spec["service"]["unit"]
        ctl = Systemd(spec["service"]["scope"], spec["service"]["sudo"])
        service = dict(ctl.show(unit), manager="systemd", unit=unit)
    locks = [probe_lock(args.root, key) for key in lock_keys(spec)]
    return dict({"ok": True, "service": service, "locks": locks, "python": "%d.%d.%d" % sys.version_info[:3]},
                **preflight_gpus(spec))


# ── main ──────────────────────────────────────────────────────────────────────────────────────────────

class ArgParser(argparse.ArgumentParser):
    """argparse that raises `bad-args` instead of printing usage and exiting 2."""

    def error(self, message):
        raise Fail("bad-args", message)


def build_parser(sub: str) -> ArgParser:
    parser = ArgParser(prog="supervisor.py " + sub, add_help=False)
    parser.add_argument("--root", required=True)
    if sub == "status":
        parser.add_argument("--job-id", action="append", default=[])
    elif sub == "preflight":
        parser.add_argument("--job-id")
    elif sub != "service-restore":
        parser.add_argument("--job-id", required=True)
    options = {
        "start": [("--queue", dict(action="store_true"))],
        "_run": [("--queue", dict(action="store_true")), ("--ready-fd", dict(type=int, required=True))],
        "_guard": [("--life-fd", dict(type=int, required=True))],
        "logs": [("--offset", dict(type=int, required=True)), ("--max", dict(type=int, default=1 << 20)),
                 ("--wait", dict(type=float, default=0.0))],
        "service-restore": [("--unit", dict(required=True)), ("--scope", dict(choices=["system", "user"],
                            default="system")), ("--sudo", dict(action="store_true")),
                            ("--health-url", dict(default=None)), ("--max-wait", dict(type=float, default=50.0))],
    }
    for flag, kwargs in options.get(sub, []):
        parser.add_argument(flag, **kwargs)
    return parser


COMMANDS = {"preflight": cmd_preflight, "start": cmd_start, "status": cmd_status, "logs": cmd_logs,
            "cancel": cmd_cancel, "restore": cmd_restore, "service-restore": cmd_service_restore,
            "result": cmd_result, "_run": cmd_run, "_guard": cmd_guard}


def dispatch(argv: list) -> dict:
    if not argv or argv[0] not in COMMANDS:
        raise Fail("bad-args", "usage: supervisor.py {%s} … --root ROOT" % ",".join(sorted(COMMANDS)))
    args = build_parser(argv[0]).parse_args(argv[1:])
    args.root = os.path.abspath(os.path.expanduser(args.root))
    return COMMANDS[argv[0]](args)


def main(argv: list) -> int:
    try:
        answer = dispatch(argv)
    except Fail as exc:
        answer = exc.answer()
    except Exception as exc:  # the one place an unexpected error becomes an answer
        answer = {"ok": False, "error": "internal", "message": "%s: %s" % (type(exc).__name__, exc),
                  "traceback": traceback.format_exc()[-2000:]}
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
    return 0 if answer.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
