"""The host's retention rule (remote_payload/supervision/retention.py): `gc` deletes old ended job dirs and
unused bundles and nothing a job still needs (a running job, one whose stop the ledger says is owed, one
holding a lock, one whose status cannot be read); `--dry-run` lists without deleting; every submit applies
it, bounded. Real supervisor calls (tests/harness/supervisor_calls.Host) and the `runner` CLI on the local host.
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from remote_payload.host.processes import identity
from tests.cli_helpers import local_target, python_payload, run_cli, submit, wait_terminal, write_job
from tests.harness.supervisor_calls import Host
from tests.hosts._proc import shared_tmpdir

OLD = time.time() - 30 * 86400


def old_job(root: Path, job_id: str, state: str = "SUCCEEDED", *, status: dict | None = None, bundle: str | None = None,
            when: float = OLD) -> Path:
    """A job dir as a past job left it, last written `when`."""
    folder = root / "jobs" / job_id
    folder.mkdir(parents=True)
    (folder / "spec.json").write_text(json.dumps({"payload": {"bundle": bundle}}))
    (folder / "status.json").write_text(json.dumps(status or {"schema": 1, "job_id": job_id, "state": state}))
    (folder / "output.log").write_text("old output\n")
    os.utime(folder, (when, when))
    return folder


def old_bundle(root: Path, kind: str, name: str, when: float = OLD) -> Path:
    folder = root / kind / name
    folder.mkdir(parents=True)
    (folder / "supervisor.py").write_text("# a bundle\n")
    os.utime(folder, (when, when))
    return folder


@pytest.fixture
def host(tmp_path):
    host = Host(tmp_path)
    yield host
    host.cleanup()


@pytest.fixture
def crowded(host):
    """Old ended jobs, and beside them an old one of each kind that must stay."""
    root = host.root
    for k in range(5):
        old_job(root, "ended-%d" % k, bundle="b0b0b0b0b0b0b0b0" if k == 0 else None)
    old_job(root, "running", "RUNNING")
    old_job(root, "owed")
    locks = Path(os.environ["RUNNER_LOCK_DIR"])  # the host lock place (tests/conftest.py)
    (locks / "runner-ledger-service-sglang.service.json").write_text(json.dumps(
        {"unit": "sglang.service", "job_id": "owed", "root": str(root)}))
    old_job(root, "locked")
    (locks / "runner-gpu-7.json").write_text(json.dumps({"job_id": "locked", "pid": os.getpid(), "since": OLD,
                                                         "root": str(root)}))
    held = os.open(locks / "runner-gpu-7.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)
    restoring = old_job(root, "restoring", "LOST")
    restore_lock = os.open(restoring / "restore.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(restore_lock, fcntl.LOCK_EX)
    os.utime(restoring, (OLD, OLD))
    guard = subprocess.Popen(["sleep", "300"])  # stands for a guard still settling the job
    old_job(root, "live-guard", status={"state": "FAILED", "guard": identity(guard.pid)})
    unreadable = old_job(root, "unreadable")
    (unreadable / "status.json").write_text("{cut sh")
    os.utime(unreadable, (OLD, OLD))
    old_job(root, "recent", when=time.time() - 3600)
    old_bundle(root, "payloads", "a0a0a0a0a0a0a0a0")            # old, no job names it: goes
    old_bundle(root, "payloads", "b0b0b0b0b0b0b0b0")            # named by ended-0, which goes too
    old_bundle(root, "payloads", "c0c0c0c0c0c0c0c0", time.time())  # used today: stays
    old_bundle(root, "payload", "d0d0d0d0d0d0d0d0")             # old supervisor: a job still runs, stays
    old_bundle(root, "payloads", ".part-e0e0e0e0e0e0e0e0")      # an upload cut long ago: goes
    old_bundle(root, "payloads", ".part-f0f0f0f0f0f0f0f0", time.time())  # an upload under way: stays
    yield root
    guard.kill()
    guard.wait()
    os.close(held)
    os.close(restore_lock)


MUST_STAY = {"running", "owed", "locked", "restoring", "live-guard", "unreadable", "recent"}


def test_gc_dry_run_lists_and_deletes_nothing(host, crowded):
    before = sorted(p.name for p in (crowded / "jobs").iterdir())
    answer = host.ok("gc", "--keep-jobs", "0", "--dry-run")
    assert answer["dry_run"] is True
    assert sorted(answer["jobs"]) == ["ended-%d" % k for k in range(5)], answer
    assert sorted(p.name for p in (crowded / "jobs").iterdir()) == before
    assert (crowded / "payloads" / "a0a0a0a0a0a0a0a0").is_dir()


def test_gc_deletes_exactly_the_old_ended_jobs_and_unused_bundles(host, crowded):
    answer = host.ok("gc", "--keep-jobs", "0")
    assert sorted(answer["jobs"]) == ["ended-%d" % k for k in range(5)], answer
    assert {p.name for p in (crowded / "jobs").iterdir()} == MUST_STAY
    assert sorted(answer["payloads"]) == [".part-e0e0e0e0e0e0e0e0", "a0a0a0a0a0a0a0a0", "b0b0b0b0b0b0b0b0"], answer
    assert sorted(p.name for p in (crowded / "payloads").iterdir()) == [".part-f0f0f0f0f0f0f0f0", "c0c0c0c0c0c0c0c0"]
    assert answer["supervisors"] == [] and (crowded / "payload" / "d0d0d0d0d0d0d0d0").is_dir()
    assert not list((crowded / "tmp").iterdir())  # nothing half-deleted left behind


def test_gc_keeps_the_newest_and_the_young(host):
    for k in range(6):
        old_job(host.root, "job-%d" % k, when=OLD + k)
    old_bundle(host.root, "payload", "d0d0d0d0d0d0d0d0")
    answer = host.ok("gc", "--keep-jobs", "4")
    assert sorted(answer["jobs"]) == ["job-0", "job-1"], answer
    assert answer["supervisors"] == ["d0d0d0d0d0d0d0d0"]  # nothing runs or owes a stop: an old one goes
    assert host.ok("gc", "--keep-jobs", "0", "--keep-days", "60")["jobs"] == []


def test_gc_refuses_a_negative_or_nan_rule(host):
    for flags in (["--keep-days", "nan"], ["--keep-jobs", "-1"]):
        rc, answer = host.call("gc", *flags)
        assert rc == 1 and answer["error"] == "bad-args", answer


def test_submit_applies_the_rule_bounded_and_runner_gc_runs_it_by_hand():
    work, target = shared_tmpdir("runner-gc-"), local_target()
    root = Path(target.root)
    for k in range(230):
        old_job(root, "past-%03d" % k, when=OLD + k)
    old_job(root, "running", "RUNNING", when=OLD - 1)
    command = python_payload(work, "ok.py", "print('ok')\n")
    path = write_job(work / "job.yaml", target, command=command)
    job_id = submit(target, path)
    assert wait_terminal(target, job_id)["state"] == "SUCCEEDED"
    left = {p.name for p in (root / "jobs").iterdir()}
    assert job_id in left and "running" in left and "past-229" in left
    assert len(left) == 232 - 10, len(left)  # at most 10 deletions a submit, the oldest first
    # left: the new job, past-229…past-010, running; beyond the newest 200: past-010…past-030 and running
    assert "past-000" not in left and "past-009" not in left and "past-010" in left

    done = run_cli(target, "gc", str(path), "--dry-run", "--json")
    assert done.returncode == 0, done.stderr.decode()
    listed = json.loads(done.stdout)  # made here, not submitted by this controller: another's, kept
    assert listed["dry_run"] and listed["jobs"] == [] and len(listed["others"]) == 21, listed
    listed = json.loads(run_cli(target, "gc", str(path), "--dry-run", "--all", "--json").stdout)
    assert listed["dry_run"] and len(listed["jobs"]) == 21 and "running" not in listed["jobs"]
    assert {p.name for p in (root / "jobs").iterdir()} == left
    done = run_cli(target, "gc", str(path), "--all")
    assert done.returncode == 0, done.stderr.decode()
    assert "deleted 21 job dirs" in done.stdout.decode(), done.stdout.decode()
    assert len(list((root / "jobs").iterdir())) == 200 + 1  # the newest 200, and the running one
