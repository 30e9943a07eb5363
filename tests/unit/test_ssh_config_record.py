"""`ssh -G`'s answer is kept in the state dir between commands (each CLI command is a new process), and used only
for the same ssh argv, the same config files as they are and within SSH_G_TTL_S; the trust tag remembered beside
it is the one its known_hosts files make now. An `ssh` stand-in (this machine's real one would read the real
config) answers `-G` and logs each time it is asked."""
from __future__ import annotations

from pathlib import Path

import pytest

from runner.deadline import Deadline
from runner.remote import transport_openssh
from runner.remote.transport import SshTarget
from runner.remote.transport_openssh import OpenSshTransport, control_socket_dir, sockets_home, trust_tag

FAKE_SSH = """#!/bin/sh
echo "$@" >> {log}
cat <<EOF
hostname 127.0.0.1
port 2222
userknownhostsfile {known}
globalknownhostsfile /nonexistent/ssh_known_hosts
stricthostkeychecking true
controlpath none
EOF
"""


@pytest.fixture
def ssh(tmp_path, monkeypatch):
    log, known, config = tmp_path / "asked", tmp_path / "known_hosts", tmp_path / "ssh_config"
    fake = tmp_path / "fake-ssh"
    fake.write_text(FAKE_SSH.format(log=log, known=known))
    fake.chmod(0o755)
    known.write_text("[127.0.0.1]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOnly+a+test+key+is+here+0000000000000000\n")
    config.write_text("Host box\n  HostName 127.0.0.1\n")
    monkeypatch.setenv("RUNNER_SSH_CONFIG", str(config))
    return fake, log, known, config


def control_path(fake: Path, state: Path) -> str:
    """The ControlPath a new command's transport (a new process: nothing in memory) puts in its ssh argv."""
    transport_openssh._SSH_G.clear()
    transport = OpenSshTransport(SshTarget("box"), state=state, ssh=str(fake))
    argv = transport.command("true", Deadline(10))
    return next(word.split("=", 1)[1] for word in argv if word.startswith("ControlPath="))


def asked(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_a_new_command_takes_ssh_g_from_the_state_dir(ssh, tmp_path):
    fake, log, _, _ = ssh
    first = control_path(fake, tmp_path)
    assert asked(log) == 1 and " -G " in log.read_text()
    assert control_path(fake, tmp_path) == first and asked(log) == 1
    control_path(fake, tmp_path / "other-state")  # another state dir: its own record
    assert asked(log) == 2


def test_a_changed_config_or_an_old_answer_asks_ssh_again(ssh, tmp_path, monkeypatch):
    fake, log, _, config = ssh
    control_path(fake, tmp_path)
    config.write_text(config.read_text() + "  ServerAliveInterval 5\n")
    control_path(fake, tmp_path)
    assert asked(log) == 2
    control_path(fake, tmp_path)
    assert asked(log) == 2
    monkeypatch.setattr(transport_openssh, "SSH_G_TTL_S", 0.0)
    control_path(fake, tmp_path)
    assert asked(log) == 3


def test_the_remembered_trust_tag_is_the_one_known_hosts_makes_now(ssh, tmp_path):
    fake, _, known, _ = ssh
    resolved = transport_openssh.parse_ssh_g(FAKE_SSH.split("<<EOF\n", 1)[1].split("EOF", 1)[0].format(known=known))
    first = control_path(fake, tmp_path)
    assert Path(first).parent == control_socket_dir(tmp_path / "cm" / trust_tag(resolved), sockets_home())
    assert control_path(fake, tmp_path) == first
    known.write_text("")  # a key removed: a new master, verified afresh, in a dir of its own
    changed = control_path(fake, tmp_path)
    assert changed != first and Path(changed).parent == control_socket_dir(tmp_path / "cm" / trust_tag(resolved), sockets_home())
    assert control_path(fake, tmp_path) == changed


def test_an_unreadable_or_foreign_record_is_a_miss(ssh, tmp_path):
    fake, log, _, _ = ssh
    first = control_path(fake, tmp_path)
    (record,) = (tmp_path / "ssh").iterdir()
    for text in ("{torn", "[]", record.read_text().replace('"key": "', '"key": "another ')):
        record.write_text(text)
        assert control_path(fake, tmp_path) == first
    assert asked(log) == 4
