"""`runner gc` on a login several controllers share (one host.root, each controller its own state dir): by
default it deletes only the jobs this controller submitted, and says in --dry-run which it leaves to others;
and a finished job's state and result, once fetched, stay in the controller's state dir, so a job the host's
retention deleted still answers `results` and `list`. On the confined systemd + sshd host.
"""
from __future__ import annotations

import json

import pytest

from tests.cli_helpers import Target, run_cli, wait_terminal, write_job

pytestmark = pytest.mark.systemd


def controller(target: Target, state_dir) -> Target:
    """The same host and host.root, seen from another controller (its own RUNNER_STATE_DIR)."""
    return Target(target.kind, target.host, target.root, dict(target.env, RUNNER_STATE_DIR=str(state_dir)),
                  target.ssh_host)


def finished_job(target: Target, job_file, value: int) -> str:
    done = run_cli(target, "submit", str(job_file), "--json", "--set", f"payload.env.N={value}")
    assert done.returncode == 0, done.stderr.decode()
    job_id = json.loads(done.stdout)["job_id"]
    assert wait_terminal(target, job_id, timeout=120)["state"] == "SUCCEEDED"
    return job_id


def test_gc_deletes_only_this_controllers_jobs_and_results_survive_the_hosts_retention(service_host, work):
    root = work / "root"
    shared = Target("ssh", {"address": service_host.alias, "root": str(root)}, root,
                    {"RUNNER_SSH_CONFIG": str(service_host.ssh_config)}, service_host)
    mine, theirs = controller(shared, work / "state-mine"), controller(shared, work / "state-theirs")
    job_file = write_job(work / "job.yaml", shared,
                         command=["sh", "-c", 'echo "{\\"n\\": $N}" > "$RUNNER_RESULT"'])
    my_old = finished_job(mine, job_file, 1)
    their_old, their_new = finished_job(theirs, job_file, 2), finished_job(theirs, job_file, 3)
    assert json.loads(run_cli(theirs, "results", their_old, "--json").stdout) == {"n": 2}  # fetched

    rule = ("--keep-jobs", "1", "--keep-days", "0")
    dry = json.loads(run_cli(mine, "gc", str(job_file), *rule, "--dry-run", "--json").stdout)
    assert dry["jobs"] == [my_old] and their_old in dry["others"], dry
    done = run_cli(mine, "gc", str(job_file), *rule, "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["jobs"] == [my_old], done.stdout
    left = service_host.ssh(["ls", f"{root}/jobs"]).stdout.split()
    assert their_old in left and their_new in left and my_old not in left, left

    # the other controller's own gc, every job: its fetched result and state outlive the job dir
    done = run_cli(theirs, "gc", str(job_file), "--keep-jobs", "0", "--keep-days", "0", "--all", "--json")
    assert their_old in json.loads(done.stdout)["jobs"], done.stdout
    kept = run_cli(theirs, "results", their_old, "--json")
    assert kept.returncode == 0 and json.loads(kept.stdout) == {"n": 2}, (kept.returncode, kept.stdout)
    listed = run_cli(theirs, "status", their_old, "--json")
    assert json.loads(listed.stdout)["state"] == "SUCCEEDED", listed.stdout
