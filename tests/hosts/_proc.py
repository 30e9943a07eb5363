"""Small process helpers shared by the test hosts: free ports, waiting, user accounts, private dirs."""

from __future__ import annotations

import ctypes
import itertools
import os
import pwd
import re
import shlex
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


LOGIN_PREFIX = "rt"  # login names rt-<owner pid>-<n>-<role>: unique per test process, <= 32 characters
_login_numbers = itertools.count()
_created_here: set[str] = set()


def new_login_names(*roles: str) -> tuple[str, ...]:
    """Fresh login names for one host, one per role: rt-<our pid>-<n>-<role>."""
    number = next(_login_numbers)
    return tuple(f"{LOGIN_PREFIX}-{os.getpid()}-{number}-{role}" for role in roles)


def create_login_user(name: str, home: Path, shell: str = "/bin/bash") -> None:
    """A throwaway login `name` whose HOME is the empty dir `home`: no rc files, so its shell is plain.

    The password field `*` ("no password works") instead of useradd's `!` (locked): sshd refuses a locked
    account under `UsePAM no`.
    """
    run_account_tool(["useradd", "--home-dir", str(home), "--no-create-home", "--shell", shell,
                      "--password", "*", name])
    home.mkdir(mode=0o755)
    entry = pwd.getpwnam(name)
    os.chown(home, entry.pw_uid, entry.pw_gid)


def remove_login_user(name: str) -> None:
    """userdel `name` (its home lives in the host's workdir, removed with it); gone already is fine."""
    run_account_tool(["userdel", name], fine=(0, 6))


# useradd/userdel exit 1 or 10 when they cannot lock the passwd or group file (another test run is adding or
# removing its logins), userdel 8 while a killed session's process is not yet reaped: worth another try.
ACCOUNT_TOOL_RETRY = (1, 8, 10)


def run_account_tool(argv: list[str], fine: tuple[int, ...] = (0,)) -> None:
    for _attempt in range(40):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode not in ACCOUNT_TOOL_RETRY:
            break
        time.sleep(0.5)
    if done.returncode not in fine:
        raise RuntimeError(f"{shlex.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")


def remove_stale_login_users() -> None:
    """Remove logins left by test runs that died without teardown (owner pid in the name is gone).

    Only names of our pattern whose HOME is one of our /tmp/runner-* dirs are touched. A name with our own
    pid is stale too: this process has not created it (the pid was reused).
    """
    for entry in pwd.getpwall():
        owner = re.fullmatch(rf"{LOGIN_PREFIX}-(\d+)-\d+-\w+", entry.pw_name)
        if not owner or not entry.pw_dir.startswith("/tmp/runner-"):
            continue
        pid = int(owner.group(1))
        if not pid_alive(pid) or (pid == os.getpid() and entry.pw_name not in _created_here):
            remove_login_user(entry.pw_name)


def create_host_logins(workdir: Path, roles: tuple[str, ...], shells: dict | None = None) -> tuple[str, ...]:
    """One fresh login per role with HOME under `workdir`/home, its login shell `shells[role]` (default bash);
    `remove_login_user` each at teardown."""
    remove_stale_login_users()
    names = new_login_names(*roles)
    (workdir / "home").mkdir(mode=0o755, exist_ok=True)
    for role, name in zip(roles, names):
        create_login_user(name, workdir / "home" / name, (shells or {}).get(role, "/bin/bash"))
        _created_here.add(name)
    return names


def remove_host_logins(names) -> None:
    for name in names:
        remove_login_user(name)
        _created_here.discard(name)


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
