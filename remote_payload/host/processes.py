"""Processes: the commands the supervisor runs (argv, never a shell, each bounded) and the processes it watches:
identity from /proc (a pid is trusted only with its start time), its cgroup's members, process-group kills.
"""
from __future__ import annotations

import os
import time

from .answer import Fail
from .parsers import parse_cgroup, sudo_wants_password

TYPE_CHECKING = False  # nor typing (mypy reads the name as typing's)
if TYPE_CHECKING:  # the functions that run a command import it: the read-only verbs never load it
    import subprocess

POLL_S = 0.1
KILL_CONFIRM_S = 10.0        # after SIGKILL, how long to wait for the group to vanish
CMD_TIMEOUT_S = 120.0
ABANDON_S = 5.0              # after killing a command that ran past its timeout: wait this long, then abandon it
SUDO_HINT = ("sudo asks for a password; add a NOPASSWD sudoers rule for systemctl (and systemd-run), e.g. "
             "'USER ALL=(root) NOPASSWD: /usr/bin/systemctl, /usr/bin/systemd-run' via visudo -f "
             "/etc/sudoers.d/runner")


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


def group_alive(pgid: int) -> bool:
    """Whether a live (non-zombie) process is in group pgid: one kill(2) and the leader's stat; all of /proc
    is read only for a group whose leader is gone or a zombie while members are left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's group: it exists
    leader = proc_stat(pgid)
    if leader and leader[0] != "Z" and int(leader[2]) == pgid:
        return True
    return bool(group_members(pgid))


def group_of(pid: int):
    """The process group of pid, or None when it is gone."""
    fields = proc_stat(pid)
    return int(fields[2]) if fields else None


def group_members(pgid: int) -> list:
    """Live (non-zombie) processes whose process group is pgid: all of /proc read (group_alive first)."""
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = proc_stat(int(name))
            if fields and fields[0] != "Z" and int(fields[2]) == pgid:
                members.append(int(name))
    return members


def user_processes_in_own_cgroup(uid: int) -> list:
    """The live processes of this process's cgroup whose real uid is `uid`; [] where it cannot be read."""
    try:
        with open("/proc/self/cgroup") as fh:
            path = parse_cgroup(fh.read())
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
    import signal  # its enums cost every call that loads this room; only a kill needs them

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_CONFIRM_S)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc is not None:
                proc.poll()  # reap our own child so it does not linger as a zombie
            if not group_alive(pgid):
                return
            time.sleep(POLL_S)


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
    the read-only verbs (status, logs) never load it."""
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
