"""A submit validates its spec every time and sends it in one ssh command: an edit to the spec, the payload script or
a module it imports runs as edited; a spec that fails its checks, or a state dir that cannot be written, reaches no
host. Through the real CLI on the loopback sshd (OpenSSH transport) and the local host."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.cli_helpers import Target, local_target, run_cli, submit, wait_terminal, write_job
from tests.hosts._proc import shared_tmpdir


@pytest.fixture
def target(ssh_host) -> Target:
    root = shared_tmpdir("runner-root-edited-")
    return Target("ssh", {"address": ssh_host.alias, "root": str(root), "transport": "openssh"}, root,
                  {"RUNNER_SSH_CONFIG": str(ssh_host.ssh_config)}, ssh_host)


# An ssh on PATH that logs every command it runs on a host (not `ssh -G`, not `ssh -O`) to LOG.
COUNTING_SSH = """#!/bin/sh
for a in "$@"; do case "$a" in -G|-O) exec /usr/bin/ssh "$@";; esac; done
echo exec >> LOG
exec /usr/bin/ssh "$@"
"""


def counting_ssh(work) -> tuple[dict, object]:
    """(env for run_cli, the log): each ssh command the CLI runs on a host is one line."""
    (work / "bin").mkdir()
    wrapper = work / "bin" / "ssh"
    wrapper.write_text(COUNTING_SSH.replace("LOG", str(work / "ssh.log")))
    wrapper.chmod(0o755)
    return {"PATH": f"{work / 'bin'}:{os.environ['PATH']}"}, work / "ssh.log"


def execs(log) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def greeting_job(path, target: Target, greeting: str, **extra):
    return write_job(path, target, command=["sh", "-c", 'echo "$GREETING"'], env={"GREETING": greeting}, **extra)


def output_of(target: Target, job_id: str) -> bytes:
    assert wait_terminal(target, job_id)["state"] == "SUCCEEDED"
    return run_cli(target, "tail", job_id, "--from-start").stdout


def test_a_spec_whose_name_changes_at_every_submit_is_one_ssh_command_each(tmp_path, target):
    env, log = counting_ssh(tmp_path)
    job = greeting_job(tmp_path / "job.yaml", target, "zero", name="run-0")
    assert run_cli(target, "submit", str(job), env=env).returncode == 0  # the first uploads the bundle
    for i in (1, 2):
        greeting_job(job, target, f"edit {i}", name=f"run-{i}")
        before = execs(log)
        done = run_cli(target, "submit", str(job), env=env)
        assert done.returncode == 0, done.stderr.decode()
        job_id = done.stdout.decode().strip()
        assert execs(log) - before == 1 and job_id.startswith(f"run-{i}-")  # the id made from the new name
        assert output_of(target, job_id) == f"edit {i}\n".encode()


def test_an_edited_spec_that_fails_its_checks_sends_nothing(tmp_path, target):
    job = greeting_job(tmp_path / "job.yaml", target, "fine")
    assert run_cli(target, "submit", str(job)).returncode == 0
    jobs_before = sorted(p.name for p in (target.root / "jobs").iterdir())
    job.write_text(job.read_text().replace("max_runtime:", "max_runtim:"))
    refused = run_cli(target, "submit", str(job))
    assert refused.returncode == 2 and b"max_runtim" in refused.stderr
    assert sorted(p.name for p in (target.root / "jobs").iterdir()) == jobs_before  # nothing reached the host
    assert len(json.loads(run_cli(target, "list", "--json").stdout)) == 1  # the first job's record only


def test_a_state_dir_that_cannot_be_written_is_refused_before_any_host(tmp_path, target, tmpfs_state_dir):
    env, log = counting_ssh(tmp_path)
    job = greeting_job(tmp_path / "job.yaml", target, "never")
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs_state_dir)], check=True)
    done = run_cli(target, "submit", str(job), env=env)
    assert done.returncode == 2 and b"cannot be written" in done.stderr, done.stderr.decode()
    assert b"Traceback" not in done.stderr and execs(log) == 0  # no host contacted
    assert run_cli(target, "submit", str(job), "--dry-run", env=env).returncode == 0  # a dry run writes nothing


def test_an_edited_payload_script_and_its_imported_module_run_as_edited(tmp_path):
    target = local_target()
    (tmp_path / "words.py").write_text("WORD = 'first'\n")
    script = tmp_path / "say.py"
    script.write_text("from words import WORD\nprint(WORD)\n")
    job = write_job(tmp_path / "job.yaml", target, script="say.py")
    assert output_of(target, submit(target, job)) == b"first\n"
    (tmp_path / "words.py").write_text("WORD = 'second'\n")
    assert output_of(target, submit(target, job)) == b"second\n"
    script.write_text("from words import WORD\nprint(WORD + ' again')\n")
    assert output_of(target, submit(target, job)) == b"second again\n"
