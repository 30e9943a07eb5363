"""Small process helpers shared by the test hosts: free ports, waiting, user accounts, private dirs."""

from __future__ import annotations

import ctypes
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (sshd rejects `Port 0`, so we must pick one)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_accepts(address: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(predicate, timeout: float, what: str, interval: float = 0.02) -> None:
    """Poll `predicate` until it is true; raise naming `what` when `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def shared_tmpdir(prefix: str) -> Path:
    """A fresh dir under /tmp that other local users can read (pytest's tmp_path is 0700 for root)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    return path


def host_workdir(kind: str) -> Path:
    """/tmp/runner-<kind>-<our pid>-XXXX; first removes such dirs whose owning test process is gone."""
    for stale in Path("/tmp").glob(f"runner-{kind}-*-*"):
        owner = re.fullmatch(rf"runner-{kind}-(\d+)-\w+", stale.name)
        if owner and not pid_alive(int(owner.group(1))):
            shutil.rmtree(stale, ignore_errors=True)
    return shared_tmpdir(f"runner-{kind}-{os.getpid()}-")


def ensure_login_user(name: str) -> None:
    """Create `name` if missing and make it able to log in with a key under `UsePAM no`.

    `useradd` leaves the password field `!` (locked), which sshd refuses without PAM; `*` means
    "no password works" but the account is not locked. Other test runs may create it concurrently,
    so a failed useradd is fine as long as the user exists afterwards.
    """
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name],
                       capture_output=True, check=False)
        pwd.getpwnam(name)
    subprocess.run(["usermod", "-p", "*", name], capture_output=True, check=True)


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid` (used to find the namespace's PID 1 under `unshare --fork`)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(word) for word in text.split()]


def is_root() -> bool:
    return os.geteuid() == 0


PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Popen preexec_fn: SIGKILL this child when the test process dies, so a killed pytest leaks no host.

    The setting survives exec, so it reaches the sshd the launch scripts exec into.
    """
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    """True for a running process; a zombie (dead, not yet reaped) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
