"""`runner -v` (and RUNNER_DEBUG=1) says on stderr each ssh command line as run and each supervisor call with its
time and exit code; without it, none of that is said. Through the real CLI on the loopback sshd (OpenSSH)."""
from __future__ import annotations

import re

import pytest

from tests.cli_helpers import Target, run_cli, write_job
from tests.hosts._proc import shared_tmpdir

CALL = re.compile(rb"\[runner -v [0-9:]{8}\] \S+: supervisor preflight \(\d+ bytes on stdin\): exit 0, \d+ bytes in "
                  rb"[0-9.]+ s")


@pytest.fixture
def target(ssh_host) -> Target:
    root = shared_tmpdir("runner-root-verbose-")
    return Target("ssh", {"address": ssh_host.alias, "root": str(root), "transport": "openssh"}, root,
                  {"RUNNER_SSH_CONFIG": str(ssh_host.ssh_config)}, ssh_host)


@pytest.mark.parametrize("switch", [("-v",), ("--verbose",), ()])
def test_each_ssh_command_and_call_is_said_with_its_time(tmp_path, target, switch):
    job = write_job(tmp_path / "job.yaml", target, command=["true"])
    env = {} if switch else {"RUNNER_DEBUG": "1"}
    done = run_cli(target, *switch, "submit", str(job), "--dry-run", env=env)
    assert done.returncode == 0, done.stderr.decode()
    assert CALL.search(done.stderr), done.stderr.decode()
    ssh_lines = [line for line in done.stderr.splitlines() if re.match(rb"\[runner -v [0-9:]{8}\] \S*ssh ", line)]
    assert ssh_lines and all(target.host["address"].encode() in line for line in ssh_lines), done.stderr.decode()


def test_without_it_nothing_is_said(tmp_path, target):
    job = write_job(tmp_path / "job.yaml", target, command=["true"])
    done = run_cli(target, "submit", str(job), "--dry-run", env={"RUNNER_DEBUG": "0"})
    assert done.returncode == 0 and b"[runner -v" not in done.stderr, done.stderr.decode()
