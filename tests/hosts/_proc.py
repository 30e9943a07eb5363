"""Small process helpers shared by the test hosts: free ports, waiting, user accounts, private dirs."""

from __future__ import annotations

import os
import pwd
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
