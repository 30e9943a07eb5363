"""A Slurm job ended before our supervisor wrote anything, and slurmctld has since forgotten it.

Each cluster here has MinJobAge=2 (Slurm's least): 2 s after a job ends, `squeue -j` answers "Invalid job
id specified". With accounting (slurmdbd + MariaDB) sacct still has the job's true final state, and runner
must take it from there; without accounting nobody knows it, and runner must say so instead of guessing.
The job waits (`--begin` an hour away: Reason=BeginTime) and is scancelled outside runner, so our
supervisor never starts and status.json stays QUEUED until the login node asks Slurm.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_helpers import Target, job_dir, run_cli, status, wait_for
from tests.harness.slurm_jobs import slurm_job, slurm_target, submit_json
from tests.hosts.prereqs import require
from tests.hosts.slurm_cluster import missing_prerequisites, start_slurm_cluster

pytestmark = pytest.mark.slurm
MIN_JOB_AGE = 2


@pytest.fixture(scope="module", params=[True, False], ids=["accounting", "no-accounting"])
def cluster(request):
    require(missing_prerequisites(accounting=request.param))
    started = start_slurm_cluster(nodes=1, accounting=request.param, min_job_age=MIN_JOB_AGE)
    yield started
    started.stop()


@pytest.fixture
def target(cluster):
    return slurm_target(cluster)


def held_then_scancelled_and_forgotten(cluster, target: Target, tmp_path: Path) -> dict:
    """Submit a job that waits through runner, scancel it outside runner, wait until squeue forgot it."""
    submitted = submit_json(target, slurm_job(tmp_path / "job.yaml", target, command=["true"],
                                              slurm={"extra_args": ["--begin=now+3600"]}))
    slurm_id = submitted["slurm_job_id"]
    assert cluster.job_field(slurm_id, "JobState") == "PENDING"
    cluster.run(["scancel", slurm_id], check=True)

    def forgotten() -> bool:
        done = cluster.run(["squeue", "-h", "-t", "all", "-j", slurm_id])
        return done.returncode != 0 and "Invalid job id specified" in done.stderr

    # slurmctld purges every MinJobAge seconds at most (its background loop): bounded, generous
    wait_for(forgotten, 90, f"squeue to forget job {slurm_id}")
    return submitted


def test_a_job_slurm_ended_and_forgot_gets_its_final_state_from_sacct_or_is_lost(cluster, target, tmp_path):
    submitted = held_then_scancelled_and_forgotten(cluster, target, tmp_path)

    job = status(target, submitted["job_id"])

    if cluster.accounting:
        assert job["state"] == "CANCELLED", (job["message"], job["slurm"])
        assert job["message"] == "Slurm ended the job: CANCELLED"
        assert job["slurm"]["state"] == "CANCELLED" and job["slurm"]["error"] is None
    else:
        assert job["state"] == "LOST", (job["message"], job["slurm"])
        assert "squeue" in job["message"] and "sacct" in job["message"]
        assert f"Slurm job {submitted['slurm_job_id']}" in job["message"]
        assert "accounting storage is disabled" in job["message"]
    assert job["supervisor"] is None
    assert not (job_dir(target, submitted["job_id"]) / "output.log").exists()  # the payload never ran
    line = run_cli(target, "status", submitted["job_id"]).stdout.decode()
    assert job["message"] in line
