"""The real Slurm test cluster itself (tests/hosts/slurm_cluster.py): jobs run, GPUs are handed out, limits hold,
and teardown leaves nothing behind. Later Slurm tests rely on exactly these behaviours."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from tests.hosts._proc import pid_alive, wait_until
from tests.hosts.prereqs import require
from tests.hosts.slurm_cluster import _pids_with_env, missing_prerequisites, start_slurm_cluster

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def slurm_cluster():
    """One node, `gpu:2`, with slurmdbd accounting; shared by this module's tests."""
    require(missing_prerequisites())
    cluster = start_slurm_cluster(nodes=1)
    yield cluster
    cluster.stop()


def test_sbatch_wrap_completes_with_output_and_accounting(slurm_cluster):
    text = "it's \"quoted\"; $HOME stays literal"
    out = slurm_cluster.out_dir / "wrap-%j.out"
    job = slurm_cluster.sbatch("--wrap", f"printf '%s\\n' {shlex.quote(text)}", "-o", str(out))

    assert slurm_cluster.wait_job_state(job, {"COMPLETED", "FAILED", "CANCELLED"}) == "COMPLETED"
    assert slurm_cluster.job_field(job, "ExitCode") == "0:0"
    assert Path(str(out).replace("%j", job)).read_text() == text + "\n"
    wait_until(lambda: _sacct_state(slurm_cluster, job) == "COMPLETED", 10, "sacct to record the job", 0.1)


def test_two_one_gpu_jobs_run_side_by_side_on_different_gpus(slurm_cluster):
    jobs = [slurm_cluster.sbatch(spelling, "-o", str(slurm_cluster.out_dir / "gpu-%j.out"), "--wrap",
                                 "echo CVD=$CUDA_VISIBLE_DEVICES; sleep 30")
            for spelling in ("--gres=gpu:1", "--gpus=1")]
    try:
        for job in jobs:
            slurm_cluster.wait_job_state(job, {"RUNNING"})
        outputs = [slurm_cluster.out_dir / f"gpu-{job}.out" for job in jobs]
        wait_until(lambda: all(path.exists() and path.read_text() for path in outputs), 10, "both jobs' output")
        assert sorted(path.read_text() for path in outputs) == ["CVD=0\n", "CVD=1\n"]
        assert {slurm_cluster.job_field(job, "JobState") for job in jobs} == {"RUNNING"}
    finally:
        slurm_cluster.run(["scancel", *jobs], check=True)


def test_job_asking_for_three_gpus_is_rejected_at_submit(slurm_cluster):
    with pytest.raises(subprocess.CalledProcessError) as caught:
        slurm_cluster.sbatch("--gres=gpu:3", "--wrap", "true")
    assert "Requested node configuration is not available" in caught.value.stderr


def test_scancel_ends_a_running_job_and_its_processes(slurm_cluster):
    pid_file = slurm_cluster.out_dir / "cancel.pid"
    job = slurm_cluster.sbatch("-o", "/dev/null", "--wrap", f"sleep 300 & echo $! > {pid_file}; wait")
    slurm_cluster.wait_job_state(job, {"RUNNING"})
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), 10, "the job's pid file")
    sleeper = int(pid_file.read_text())

    slurm_cluster.run(["scancel", job], check=True)

    assert slurm_cluster.wait_job_state(job, {"CANCELLED", "COMPLETED", "FAILED"}) == "CANCELLED"
    wait_until(lambda: not pid_alive(sleeper), 10, "the job's sleep to be killed")


def test_two_node_cluster_runs_beside_the_first_and_teardown_leaves_nothing(slurm_cluster):
    second = start_slurm_cluster(nodes=2)
    try:
        assert second.ports.ctld != slurm_cluster.ports.ctld and second.base != slurm_cluster.base
        assert second.db_dir != slurm_cluster.db_dir
        job = second.sbatch("-N2", "-o", str(second.out_dir / "%j.out"), "--wrap", "srun -l hostname")
        assert second.wait_job_state(job, {"COMPLETED", "FAILED"}) == "COMPLETED"
        task_lines = (second.out_dir / f"{job}.out").read_text().splitlines()
        assert sorted(line.split(":")[0] for line in task_lines) == ["0", "1"]  # srun -l: one task per node
        left_running = second.sbatch("-o", "/dev/null", "--wrap", "sleep 300")
        second.wait_job_state(left_running, {"RUNNING"})
    finally:
        daemons = [proc.pid for proc in second.daemons.values()]
        second.stop()
    assert not second.base.exists() and not second.db_dir.exists()
    assert not [pid for pid in daemons if pid_alive(pid)]
    assert _pids_with_env("SLURM_CONF", str(second.conf)) == []
    # the first cluster was not disturbed
    assert slurm_cluster.run(["sinfo", "-h", "-o", "%a"], check=True).stdout.strip() == "up"


def _sacct_state(cluster, job: str) -> str:
    done = cluster.run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job])
    return done.stdout.strip() if done.returncode == 0 else ""

