"""Host primitives of the supervisor: what it asks the machine, never what a job means.

Owns: the `Fail` answer, external commands run without a shell and bounded (`run_command`), systemd
(`Systemd`: systemctl/systemd-run/journalctl argv for one scope; start), nvidia-smi and the pure
parsers of its output, and process identity from /proc (a pid is trusted only with its start time) with
process-group kills. HERE is the bundle's root (the package remote_payload), where supervisor.py and the
payload scripts are. Imports only the stdlib and contract.py; every other room of the supervisor imports it.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import TYPE_CHECKING

from ..contract import memory_verdict

if TYPE_CHECKING:  # the functions that run a command import it: the read-only verbs never load it
    import subprocess

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUPERVISOR = os.path.join(HERE, "supervisor.py")  # the entry point every detached process re-executes
# ... with this interpreter and its -S (the launch line's: stdlib only, no site-packages' .pth files to run)
RUN_SUPERVISOR = [sys.executable] + (["-S"] if sys.flags.no_site else []) + [SUPERVISOR]

NOT_A_NUMBER = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", "")
POLL_S = 0.1
KILL_CONFIRM_S = 10.0        # after SIGKILL, how long to wait for the group to vanish
CMD_TIMEOUT_S = 120.0
SMI_TIMEOUT_S = 60.0         # one nvidia-smi call
ABANDON_S = 5.0              # after killing a command that ran past its timeout: wait this long, then abandon it
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


def user_processes_in_own_cgroup(uid: int) -> list:
    """The live processes of this process's cgroup (v2: /proc/self/cgroup's "0::" line) whose real uid is
    `uid`; [] where the cgroup cannot be read (cgroup v1, no /sys/fs/cgroup)."""
    try:
        with open("/proc/self/cgroup") as fh:
            path = next((line[3:].strip() for line in fh if line.startswith("0::")), None)
        if path is None:
            return []
        with open(os.path.join("/sys/fs/cgroup", path.lstrip("/"), "cgroup.procs")) as fh:
            pids = [int(word) for word in fh.read().split()]
    except (OSError, ValueError):
        return []
    return [pid for pid in pids if real_uid(pid) == uid and (proc_stat(pid) or ["Z"])[0] != "Z"]


def real_uid(pid: int):
    """The real uid of pid (a setuid program it runs keeps it), or None when it is gone."""
    try:
        with open("/proc/%d/status" % pid) as fh:
            line = next((line for line in fh if line.startswith("Uid:")), "")
    except OSError:
        return None
    fields = line.split()
    return int(fields[1]) if len(fields) > 1 else None


def group_is_ours(payload: dict) -> bool:
    """The group id is the leader's pid; if a process with that pid lives, it must be our leader."""
    fields = proc_stat(int(payload["pgid"]))
    return fields is None or fields[0] == "Z" or int(fields[19]) == payload.get("start_time")


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
    """GPUs that cannot give required_mib now (contract.memory_verdict: unknown free memory counts as short)."""
    return [g for g in gpus if memory_verdict(g, required_mib) != "ok"]


def refuse_too_small(gpus: list, required_mib: int) -> None:
    """A card whose total is below the need: no stop and no wait can help, so say so at once."""
    small = [g for g in gpus if memory_verdict(g, required_mib) == "too-small"]
    if small:
        raise Fail("bad-spec", "; ".join("GPU %s has %s MiB in total, less than the %d MiB the job needs" % (
            g["index"], g["total_mib"], required_mib) for g in small) + ": stopping the service cannot free that")


def describe_apps(apps: list) -> str:
    if not apps:
        return "no compute process is listed by nvidia-smi"
    return ", ".join("pid %d (%s MiB)" % (a["pid"], a["used_mib"] if a["used_mib"] is not None else "?")
                     for a in apps)

# ── systemd ───────────────────────────────────────────────────────────────────────────────────────────

def communicate_within(proc: subprocess.Popen, timeout: float):
    """(stdout, stderr) of proc, or None when it ran past timeout: then it is killed, and abandoned if it will not
    die within ABANDON_S. subprocess.run would wait for the killed child without bound; one stuck in the kernel
    (nvidia-smi on a wedged GPU, a hung filesystem) never dies, and nothing may block the way to the restore."""
    import subprocess

    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.communicate(timeout=ABANDON_S)
        except subprocess.TimeoutExpired:
            pass  # abandoned, not waited for
        return None


def run_command(argv: list, timeout: float = CMD_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run argv (never a shell); sudo wanting a password becomes `sudo-password`. subprocess is imported here:
    the read-only verbs (status, logs) run no command and never load it (nor threading, selectors)."""
    import subprocess

    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except FileNotFoundError:
        raise Fail("internal", "%s is not installed on this host" % argv[0]) from None
    output = communicate_within(proc, timeout)
    if output is None:
        raise Fail("timeout", "%s did not finish within %.0f s" % (" ".join(argv[:4]), timeout))
    done = subprocess.CompletedProcess(argv, proc.returncode, *output)
    stderr = done.stderr.decode("utf-8", "replace")
    if os.path.basename(argv[0]) == "sudo" and sudo_wants_password(done.returncode, stderr):
        raise Fail("sudo-password", SUDO_HINT)
    return done


# What systemctl says when no manager of its scope can be reached (PID 1 is not systemd, no user manager).
NO_MANAGER_SIGNS = ("has not been booted with systemd", "Failed to connect to bus")


def no_service_manager(stderr: str) -> bool:
    return any(sign in stderr for sign in NO_MANAGER_SIGNS)


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
            said = done.stderr.decode("utf-8", "replace").strip()[-300:]
            if no_service_manager(said):
                raise Fail("no-systemd", "cannot manage %s: this host's services are not run by systemd (%s)"
                           % (unit, said.splitlines()[0]))
            raise Fail("internal", "cannot read the state of %s: %s" % (unit, said))
        return parse_systemctl_show(done.stdout.decode("utf-8", "replace"))

    def is_active(self, unit: str) -> str:
        done = run_command(self.argv("systemctl", "is-active", unit))
        return done.stdout.decode("utf-8", "replace").strip() or "unknown"

    def change(self, verb: str, unit: str, *flags: str, timeout: float = CMD_TIMEOUT_S) -> None:
        done = run_command(self.argv("systemctl", verb, *flags, unit), timeout=timeout)
        if done.returncode != 0:
            raise Fail("internal", "systemctl %s %s failed (exit %d): %s" % (
                verb, unit, done.returncode, done.stderr.decode("utf-8", "replace").strip()[-500:]))

    def timer_argv(self, unit: str, seconds: float, command: list, run_max: float) -> list:
        # AccuracySec: systemd otherwise may fire a timer up to a minute late. RuntimeMaxSec: the command it
        # runs is killed after run_max (a transient service runs without a bound otherwise).
        return self.argv("systemd-run", "--on-active=%ds" % int(seconds), "--timer-property=AccuracySec=1s",
                         "--property=RuntimeMaxSec=%d" % int(run_max), "--unit=" + unit, *command)

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


# ── gpu ───────────────────────────────────────────────────────────────────────────────────────────────

GPU_QUERY = ["--query-gpu=index,uuid,name,memory.total,memory.used,memory.free", "--format=csv,noheader,nounits"]
APPS_QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]


def nvidia_smi(args: list) -> str:
    import shutil  # only a GPU query needs it: the read-only verbs never load it

    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise Fail("internal", "nvidia-smi is not on PATH, but the job asks for GPUs")
    done = run_command([exe] + args, timeout=SMI_TIMEOUT_S)
    if done.returncode != 0:
        raise Fail("internal", "nvidia-smi failed (exit %d): %s" % (
            done.returncode, done.stderr.decode("utf-8", "replace").strip()[-300:]))
    return done.stdout.decode("utf-8", "replace")


def query_gpus(devices: list) -> list:
    return select_gpus(parse_gpu_csv(nvidia_smi(GPU_QUERY)), devices)


def query_apps() -> list:
    return parse_apps_csv(nvidia_smi(APPS_QUERY))
