"""remote_payload/slurm/batch.py: the sbatch argv and batch script, pure; then the same through real sbatch."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from remote_payload.slurm.batch import (array_option, array_task_index, batch_script, parse_sbatch_parsable,
                                        sbatch_argv, slurm_problem, time_limit_minutes, time_problem)
from tests.hosts.prereqs import require
from tests.hosts.slurm_cluster import missing_prerequisites, start_slurm_cluster

STANDIN = Path(__file__).parents[1] / "hosts" / "slurm_supervisor_standin.py"
HOSTILE = "it's a \"dir\"; $(rm -rf ~) `x` *"


def test_sbatch_argv_has_every_field_as_one_word_and_extra_args_last():
    slurm = {"partition": "gpu", "gres": "gpu:a100:2", "account": "proj-1", "qos": "high",
             "constraint": "a100&ib", "extra_args": ["--comment=it's; fine", "--exclusive"]}
    assert sbatch_argv(slurm, "k26.x-1", "/scratch/r/jobs/k26.x-1", 32) == [
        "sbatch", "--parsable", "--no-requeue", "--job-name=runner-k26.x-1", "--chdir=/scratch/r/jobs/k26.x-1",
        "--output=/scratch/r/jobs/k26.x-1/slurm-%j.out", "--time=32", "--partition=gpu", "--account=proj-1",
        "--qos=high", "--constraint=a100&ib", "--gres=gpu:a100:2", "--comment=it's; fine", "--exclusive"]


def test_sbatch_argv_without_choices_sets_only_what_runner_owns():
    assert sbatch_argv({}, "j", "/r/jobs/j", 1) == [
        "sbatch", "--parsable", "--no-requeue", "--job-name=runner-j", "--chdir=/r/jobs/j",
        "--output=/r/jobs/j/slurm-%j.out", "--time=1"]
    assert sbatch_argv({"gpus": 2}, "j", "/r/jobs/j", 1)[-1] == "--gpus=2"


@pytest.mark.parametrize("job_dir", ["relative/jobs/j", "/r/100%/j", "/r/a\\b/j", "/r/a\nb/j"])
def test_a_job_dir_sbatch_would_rewrite_is_refused(job_dir):
    with pytest.raises(ValueError, match="a Slurm job dir must be absolute, without '%', "):
        sbatch_argv({}, "j", job_dir, 1)


def test_batch_script_execs_the_supervisor_with_each_word_quoted_once():
    root = "/scratch/" + HOSTILE
    script = batch_script("/opt/py env/bin/python3", root + "/payload/ab12/supervisor.py", root, "j-1")
    lines = script.splitlines()
    assert lines[0] == "#!/bin/sh" and lines[-1].startswith("exec ")
    assert shlex.split(lines[-1])[1:] == ["/opt/py env/bin/python3", root + "/payload/ab12/supervisor.py",
                                          "slurm-run", "--job-id", "j-1", "--root", root]


@pytest.mark.parametrize("max_runtime, grace, minutes", [(1800, 30, 32), (0, 0, 1), (60, 0, 2), (3540, 0, 60)])
def test_slurms_limit_comes_after_our_deadline_grace_and_slack(max_runtime, grace, minutes):
    assert time_limit_minutes(max_runtime, grace) == minutes


def test_an_explicit_time_shorter_than_our_deadline_is_refused():
    assert time_problem(32, 1800, 30) is None
    assert "shorter than limits.max_runtime" in time_problem(31, 1800, 30)


@pytest.mark.parametrize("slurm, words", [
    ({"partition": "gpu;rm -rf /"}, "slurm.partition"),
    ({"account": "-A"}, "slurm.account"),
    ({"gres": "gpu:1", "gpus": 1}, "give one"),
    ({"gres": "gpu:0"}, "slurm.gres"),
    ({"gres": "gpu:1\n#SBATCH --x"}, "slurm.gres"),
    ({"gpus": "0"}, "slurm.gpus"),
    ({"constraint": "a100 ib"}, "slurm.constraint"),
    ({"extra_args": ["-w node1"]}, "--name=value"),
    ({"extra_args": ["--comment=a\nb"]}, "--name=value"),
    ({"extra_args": ["--time=5"]}, "may not set --time"),
    ({"extra_args": ["--requeue"]}, "may not set --requeue"),
])
def test_bad_slurm_sections_are_refused_with_the_field(slurm, words):
    assert words in slurm_problem(slurm)


def test_good_slurm_sections_pass():
    assert slurm_problem({}) is None
    assert slurm_problem({"partition": "gpu", "gpus": "h200:8", "qos": "normal", "constraint": "[a|b]*2",
                          "extra_args": ["--exclusive", "--mem=0"]}) is None


def test_parse_sbatch_parsable():
    assert parse_sbatch_parsable("1234\n") == "1234"
    assert parse_sbatch_parsable("1234;cluster-a\n") == "1234"
    with pytest.raises(ValueError):
        parse_sbatch_parsable("sbatch: error: Batch job submission failed\n")


# ── through real sbatch ─────────────────────────────────────────────────────────────────────────────────

@pytest.fixture(scope="module")
def plain_cluster():
    """One node, gpu:2, no accounting (nothing here reads sacct)."""
    require(missing_prerequisites(accounting=False))
    cluster = start_slurm_cluster(nodes=1, accounting=False)
    yield cluster
    cluster.stop()


@pytest.mark.slurm
def test_real_sbatch_runs_the_script_in_the_job_dir_with_argv_and_gpu_intact(plain_cluster):
    root = plain_cluster.base / ("root " + HOSTILE)
    job_dir = root / "jobs" / "j-1"
    job_dir.mkdir(parents=True)
    slurm = {"partition": "debug", "gres": "gpu:1", "extra_args": ["--comment=it's; fine"]}
    argv = sbatch_argv(slurm, "j-1", str(job_dir), time_limit_minutes(90, 10))
    script = batch_script(sys.executable, str(STANDIN), str(root), "j-1")

    job = parse_sbatch_parsable(plain_cluster.run(argv, input=script, check=True).stdout)

    assert plain_cluster.wait_job_state(job, {"COMPLETED", "FAILED", "CANCELLED"}) == "COMPLETED"
    seen = json.loads((job_dir / "seen.json").read_text())
    assert seen["argv"] == ["slurm-run", "--job-id", "j-1", "--root", str(root)]
    assert seen["cwd"] == str(job_dir)
    assert seen["env"] == {"CUDA_VISIBLE_DEVICES": "0", "SLURM_JOB_ID": job, "SLURM_JOB_NAME": "runner-j-1",
                           "SLURM_GPUS_ON_NODE": "1"}
    assert (job_dir / f"slurm-{job}.out").exists()
    assert [plain_cluster.job_field(job, key) for key in ("TimeLimit", "Requeue")] == ["00:03:00", "0"]
    assert plain_cluster.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%k"]).stdout == "it's; fine\n"


@pytest.mark.slurm
def test_real_sbatch_refuses_an_unknown_partition_with_its_reason(plain_cluster):
    argv = sbatch_argv({"partition": "nosuch"}, "j-2", str(plain_cluster.out_dir), 1)
    done = plain_cluster.run(argv, input=batch_script("python3", "/x/supervisor.py", "/x", "j-2"))
    assert done.returncode == 1
    assert "invalid partition specified: nosuch" in done.stderr.lower()


def test_array_option_bounds_the_tasks_running_at_once():
    assert array_option(4, 2) == "--array=0-3%2"
    assert array_option(3, 8) == "--array=0-2%3"  # never more than there are variants
    assert array_option(1, 1) == "--array=0-0%1"
    for bad in ((0, 2), (4, 0)):
        with pytest.raises(ValueError):
            array_option(*bad)


def test_array_task_index_is_slurms_task_id_within_the_variants():
    assert array_task_index({"SLURM_ARRAY_TASK_ID": "3"}, 4) == 3
    for env in ({}, {"SLURM_ARRAY_TASK_ID": "4"}, {"SLURM_ARRAY_TASK_ID": "-1"}, {"SLURM_ARRAY_TASK_ID": "x"}):
        with pytest.raises(ValueError):
            array_task_index(env, 4)


def test_an_arrays_sbatch_argv_adds_the_array_and_one_output_file_per_task():
    argv = sbatch_argv({"gres": "gpu:1"}, "j", "/r/jobs/j", 5, array=(4, 2))
    assert "--array=0-3%2" in argv and "--output=/r/jobs/j/slurm-%A_%a.out" in argv
    assert not any(word.startswith("--output=") and word.endswith("%j.out") for word in argv)
    assert argv[-1] == "--gres=gpu:1"  # the user's choices stay last, as for one job
    assert not any(word.startswith("--array") for word in sbatch_argv({}, "j", "/r/jobs/j", 5))
