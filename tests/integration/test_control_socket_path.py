"""The ssh control sockets live at a short path of fixed length whatever TMPDIR and the state dir are: with a
100-character TMPDIR and a longer state dir, a submit, status calls and a tail over OpenSSH as a non-root login
all work (the socket's path was 109 bytes with a 35-character TMPDIR, and every host command exited 3 "too long
for Unix domain socket") and share one master, in a dir of this user's alone: $XDG_RUNTIME_DIR/runner-cm where
that is short, else /tmp/runner-cm-UID."""
from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from runner.remote.transport_openssh import SOCKET_PATH_MAX
from tests.cli_helpers import Target, run_cli, submit, wait_terminal, write_job
from tests.hosts._proc import shared_tmpdir


def long_dir(parent: Path, length: int) -> Path:
    """A dir under `parent` whose path is `length` characters long."""
    path = parent / ("d" * (length - len(str(parent)) - 1))
    path.mkdir(mode=0o700)
    assert len(str(path)) == length
    return path


@pytest.fixture
def long_target(ssh_host, tmp_path):
    """A non-root login's host, with TMPDIR 100 characters long and the state dir 120."""
    login = ssh_host.as_user(ssh_host.non_root_user)
    root = shared_tmpdir("runner-root-cm-")
    subprocess.run(["chown", login.user, str(root)], check=True)
    env = {"RUNNER_SSH_CONFIG": str(ssh_host.ssh_config), "TMPDIR": str(long_dir(tmp_path, 100)),
           "RUNNER_STATE_DIR": str(long_dir(tmp_path, 120)), "RUNNER_RESIDENT": "0"}
    yield Target("ssh", {"address": login.alias, "root": str(root), "transport": "openssh"}, root, env, login)
    subprocess.run(["rm", "-rf", str(root)], check=False)


def masters(home: Path, state: Path) -> set[Path]:
    """The master sockets under `home` in the socket dirs this state dir's ssh records name (other tests' masters
    share /tmp/runner-cm-UID)."""
    ours = set()
    for record in (state / "ssh").glob("*"):
        trust = json.loads(record.read_text()).get("trust")
        if isinstance(trust, list) and len(trust) == 3:
            ours.add(Path(trust[1]))
    return {p for p in home.glob("*/*") if p.parent in ours and stat.S_ISSOCK(p.lstat().st_mode)} \
        if home.is_dir() else set()


def private(folder: Path) -> bool:
    info = folder.lstat()
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def one_master_for_a_job(target: Target, home: Path, work: Path) -> Path:
    """A job submitted, waited for and tailed: each command worked, all on one new master under `home`."""
    state = Path(target.env["RUNNER_STATE_DIR"])
    before = masters(home, state)
    job_id = submit(target, write_job(work / "job.yaml", target, command=["echo", "hello"]))
    assert wait_terminal(target, job_id)["state"] == "SUCCEEDED"
    done = run_cli(target, "tail", job_id, "--from-start")
    assert (done.returncode, done.stdout) == (0, b"hello\n"), done.stderr.decode()
    new = masters(home, state) - before
    assert len(new) == 1, new
    (socket,) = new
    assert len(os.fsencode(str(socket))) <= SOCKET_PATH_MAX and private(home) and private(socket.parent)
    subprocess.run(["ssh", "-S", str(socket), "-O", "exit", "any"], capture_output=True, timeout=10)
    return socket


def test_a_100_character_tmpdir_and_a_long_state_dir_reach_the_host(long_target, work, monkeypatch):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    one_master_for_a_job(long_target, Path("/tmp", f"runner-cm-{os.getuid()}"), work)


def test_the_sockets_go_under_a_short_runtime_dir_and_a_long_one_is_passed_over(long_target, work, monkeypatch):
    runtime = shared_tmpdir("rt-")
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
        one_master_for_a_job(long_target, runtime / "runner-cm", work)
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(long_dir(runtime, 100)))
        one_master_for_a_job(long_target, Path("/tmp", f"runner-cm-{os.getuid()}"), work)
    finally:
        subprocess.run(["rm", "-rf", str(runtime)], check=False)
