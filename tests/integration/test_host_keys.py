"""Host keys, checked before anything runs on the host, on both SSH transports (`host.transport`) to a real
loopback sshd: an unknown or changed key is refused naming the fingerprint, known_hosts markers are understood,
`host_key_policy: accept-new` records the key once.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_helpers import Target, run_cli, submit, wait_terminal, write_job


@pytest.fixture(params=["openssh", "paramiko"])
def transport(request) -> str:
    """host.transport: each test runs on both."""
    return request.param


def _ssh_config_with(ssh_host, known_hosts: Path, tmp: Path) -> Path:
    text = ssh_host.ssh_config.read_text().replace(str(ssh_host.known_hosts), str(known_hosts))
    path = tmp / "ssh_config"
    path.write_text(text)
    return path


def test_unknown_host_key_refused_with_fingerprint(ssh_host, work, transport):
    target = Target("ssh", {"address": ssh_host.alias, "root": str(work / "root"), "transport": transport}, work / "root",
                    {"RUNNER_SSH_CONFIG": str(_ssh_config_with(ssh_host, ssh_host.empty_known_hosts(), work))})
    job = write_job(work / "job.yaml", target, command=["true"])
    done = run_cli(target, "submit", str(job))
    assert done.returncode == 3
    assert b"not in known_hosts" in done.stderr and b"SHA256:" in done.stderr
    assert not (work / "root").exists()  # nothing ran on the host


def test_changed_host_key_refused(ssh_host, work, transport):
    target = Target("ssh", {"address": ssh_host.alias, "root": str(work / "root"), "transport": transport}, work / "root",
                    {"RUNNER_SSH_CONFIG": str(_ssh_config_with(ssh_host, ssh_host.wrong_known_hosts(), work))})
    job = write_job(work / "job.yaml", target, command=["true"])
    done = run_cli(target, "submit", str(job))
    assert done.returncode == 3 and b"CHANGED" in done.stderr
    assert not (work / "root").exists()


@pytest.mark.parametrize("marker", ["@cert-authority", "@revoked"])
def test_known_hosts_markers_are_understood_never_a_traceback(ssh_host, work, marker, transport):
    """OpenSSH's `@cert-authority`/`@revoked` lines for another host: OpenSSH honours both (the host's own line
    verifies it). paramiko cannot read them: a CA line trusts nothing there, so the host's own line still
    verifies it; a revocation cannot be honoured, so nothing runs (exit 3)."""
    known = work / "known_hosts"
    other_key = ssh_host.wrong_known_hosts().read_text().split()[-2:]
    known.write_text(f"{marker} *.example.org {' '.join(other_key)}\n" + ssh_host.known_hosts.read_text())
    target = Target("ssh", {"address": ssh_host.alias, "root": str(work / "root"), "transport": transport},
                    work / "root", {"RUNNER_SSH_CONFIG": str(_ssh_config_with(ssh_host, known, work))})
    job = write_job(work / "job.yaml", target, command=["true"])
    done = run_cli(target, "submit", str(job))
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    if marker == "@cert-authority" or transport == "openssh":
        assert done.returncode == 0, done.stderr.decode()
        return
    assert done.returncode == 3 and marker.encode() in done.stderr and str(known).encode() in done.stderr
    assert not (work / "root").exists()  # nothing ran on the host


def test_accept_new_records_the_key_once(ssh_host, work, transport):
    known = work / "known_hosts"
    known.write_text("")
    host = {"address": ssh_host.alias, "root": str(work / "root"), "host_key_policy": "accept-new",
            "transport": transport}
    target = Target("ssh", host, work / "root",
                    {"RUNNER_SSH_CONFIG": str(_ssh_config_with(ssh_host, known, work))})
    job = write_job(work / "job.yaml", target, command=["true"])
    job_id = submit(target, job)
    assert ssh_host.host_key.split()[1] in known.read_text()
    wait_terminal(target, job_id)
    assert len(known.read_text().splitlines()) == 1
