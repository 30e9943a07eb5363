"""An edited spec's submit opens its host call while the spec is validated (controller.early_submit), on the
last plan made from the same file: the host gets the wire form only once the checks passed and the validated
plan goes to the same host with the same bundle; otherwise the call is closed unsent and nothing happens on
that host. On the loopback sshd, OpenSSH transport."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from runner.commands import controller
from runner.deadline import Deadline
from runner.state.store import Store
from tests.cli_helpers import Target, run_cli, wait_terminal, write_job
from tests.hosts._proc import shared_tmpdir


@pytest.fixture
def target(ssh_host) -> Target:
    root = shared_tmpdir("runner-root-early-")
    return Target("ssh", {"address": ssh_host.alias, "root": str(root), "transport": "openssh"}, root,
                  {"RUNNER_SSH_CONFIG": str(ssh_host.ssh_config)}, ssh_host)


@pytest.fixture(autouse=True)
def ssh_config(target, monkeypatch):
    monkeypatch.setenv("RUNNER_SSH_CONFIG", target.env["RUNNER_SSH_CONFIG"])


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


def early_then_submit(job, **submit_options):
    """What `runner submit JOB` does: the call opened, the plan made, the submit on the call if it fits."""
    deadline = Deadline.for_command(30)
    with controller.early_submit(str(job), [], store=Store(), job_id=None, queue=False, deadline=deadline) as early:
        opened = early is not None and early.call.started
        plan = controller.local_plan(str(job), [])
        done = controller.submit(str(job), [], store=Store(), progress=lambda _m: None, planned=plan,
                                 deadline=deadline, early=early, **submit_options)
    return opened, early, done


def test_an_edited_spec_is_submitted_on_the_call_opened_before_its_validation(tmp_path, target):
    job = greeting_job(tmp_path / "job.yaml", target, "first")
    opened, _, first = early_then_submit(job)
    assert not opened  # never planned: nothing to guess from
    greeting_job(job, target, "edited")
    opened, early, done = early_then_submit(job)
    assert opened and done.job_id == early.job_id and done.round_trips == 1
    assert output_of(target, done.job_id) == b"edited\n" and output_of(target, first.job_id) == b"first\n"


def test_a_cached_plan_opens_no_early_call(tmp_path, target):
    job = greeting_job(tmp_path / "job.yaml", target, "same")
    early_then_submit(job)
    opened, _, done = early_then_submit(job)
    assert not opened and done.round_trips == 1


def test_an_edit_to_the_host_section_closes_the_call_unsent(tmp_path, target):
    job = greeting_job(tmp_path / "job.yaml", target, "old root")
    early_then_submit(job)
    other_root = shared_tmpdir("runner-root-early-other-")
    moved = Target(target.kind, dict(target.host, root=str(other_root)), other_root, target.env, target.ssh_host)
    jobs_before = sorted(p.name for p in (target.root / "jobs").iterdir())
    greeting_job(job, moved, "new root")
    opened, early, done = early_then_submit(job)
    assert opened and early.job_id is None  # the guessed call was not used
    assert sorted(p.name for p in (target.root / "jobs").iterdir()) == jobs_before  # the old root got nothing
    assert sorted(p.name for p in (other_root / "jobs").iterdir()) == [done.job_id]
    assert output_of(moved, done.job_id) == b"new root\n"


def test_an_edited_spec_that_fails_its_checks_sends_nothing(tmp_path, target):
    job = greeting_job(tmp_path / "job.yaml", target, "fine")
    assert run_cli(target, "submit", str(job)).returncode == 0
    jobs_before = sorted(p.name for p in (target.root / "jobs").iterdir())
    job.write_text(job.read_text().replace("max_runtime:", "max_runtim:"))
    refused = run_cli(target, "submit", str(job))
    assert refused.returncode == 2 and b"max_runtim" in refused.stderr
    assert sorted(p.name for p in (target.root / "jobs").iterdir()) == jobs_before  # nothing reached the host
    assert len(json.loads(run_cli(target, "list", "--json").stdout)) == 1  # the first job's record only


def test_the_cli_submits_an_edited_spec_in_one_ssh_command(tmp_path, target):
    env, log = counting_ssh(tmp_path)
    job = greeting_job(tmp_path / "job.yaml", target, "one")
    assert run_cli(target, "submit", str(job), env=env).returncode == 0
    greeting_job(job, target, "two")
    before = execs(log)
    done = run_cli(target, "submit", str(job), env=env)
    assert done.returncode == 0, done.stderr.decode()
    assert execs(log) - before == 1
    assert output_of(target, done.stdout.decode().strip()) == b"two\n"


def test_a_spec_whose_name_changes_at_every_submit_is_one_ssh_command_each(tmp_path, target):
    env, log = counting_ssh(tmp_path)
    job = greeting_job(tmp_path / "job.yaml", target, "zero", name="run-0")
    assert run_cli(target, "submit", str(job), env=env).returncode == 0
    for i in (1, 2):
        greeting_job(job, target, f"edit {i}", name=f"run-{i}")
        before = execs(log)
        done = run_cli(target, "submit", str(job), env=env)
        assert done.returncode == 0, done.stderr.decode()
        job_id = done.stdout.decode().strip()
        assert execs(log) - before == 1 and job_id.startswith(f"run-{i}-")  # the id made from the new name
        assert output_of(target, job_id) == f"edit {i}\n".encode()


def test_an_early_call_takes_the_job_id_given(tmp_path, target):
    job = greeting_job(tmp_path / "job.yaml", target, "first", name="first")
    early_then_submit(job)
    greeting_job(job, target, "chosen", name="renamed")
    opened, early, done = early_then_submit(job, job_id="my-chosen-id")
    assert opened and done.job_id == early.job_id == "my-chosen-id" and done.round_trips == 1
    assert output_of(target, "my-chosen-id") == b"chosen\n"


def test_a_state_dir_that_cannot_be_written_is_refused_before_an_early_call(tmp_path, target, tmpfs_state_dir):
    env, log = counting_ssh(tmp_path)
    job = greeting_job(tmp_path / "job.yaml", target, "planned")
    assert run_cli(target, "submit", str(job), "--dry-run", env=env).returncode == 0  # a plan to guess from
    greeting_job(job, target, "edited")
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs_state_dir)], check=True)
    before = execs(log)
    done = run_cli(target, "submit", str(job), env=env)
    assert done.returncode == 2 and b"cannot be written" in done.stderr, done.stderr.decode()
    assert execs(log) == before  # no host contacted


def test_a_spec_planned_from_a_read_only_state_dir_is_not_cached_and_no_traceback(tmp_path, target, tmpfs_state_dir):
    job = greeting_job(tmp_path / "job.yaml", target, "planned")
    assert run_cli(target, "submit", str(job), "--dry-run").returncode == 0  # STATE/plans exists
    greeting_job(job, target, "edited")
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs_state_dir)], check=True)
    done = run_cli(target, "submit", str(job), "--dry-run")
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr.decode()
