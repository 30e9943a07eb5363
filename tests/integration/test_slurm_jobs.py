"""launcher: slurm end to end: the real `runner` CLI, a real Slurm cluster (tests/hosts/slurm_cluster.py).

The controller reaches the login node with the `local` transport (host.address: local), which runs exactly
the host protocol an SSH login node gets; sbatch places the job on the cluster's node, where the batch
script execs our supervisor's `slurm-run`. host.root has a space in it (it travels through sbatch's
--chdir/--output and the batch script). One node, 2 CPUs, `gpu:2` (fake device nodes), accounting on.
"""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.cli_helpers import job_dir, pid_alive, python_payload, run_cli, status, wait_for
from tests.harness.slurm_jobs import EXIT_STILL_RUNNING, follow, slurm_job, slurm_target, submit_json, wait_state
from tests.hosts.gpu_state import STANDIN, make_state_dir, write_gpus
from tests.hosts.prereqs import require
from tests.hosts.slurm_cluster import missing_prerequisites, start_slurm_cluster

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def cluster():
    require(missing_prerequisites())
    started = start_slurm_cluster(nodes=1)
    yield started
    started.stop()


@pytest.fixture
def target(cluster):
    """A fresh host.root per test; every Slurm job ended afterwards."""
    yield slurm_target(cluster)
    cluster._cancel_all_jobs()


def test_submit_tail_exactly_once_succeeded_and_results(target, cluster, tmp_path):
    command = python_payload(tmp_path, "lines.py", """
        import json, os, sys, time
        for i in range(5):
            print(f"line {i}: it's \\"quoted\\"; $HOME", flush=True)
            time.sleep(0.3)
        sys.stdout.buffer.write(b"partial \\xff")
        json.dump({"rows": [{"m": 1, "us": 2.5}]}, open(os.environ["RUNNER_RESULT"], "w"))
    """)
    submitted = submit_json(target, slurm_job(tmp_path / "job.yaml", target, command=command,
                                              slurm={"partition": "debug"}))
    job_id = submitted["job_id"]
    assert submitted["state"] == "QUEUED" and submitted["slurm_job_id"].isdigit()

    printed, code = follow(target, job_id)

    expected = "".join(f"line {i}: it's \"quoted\"; $HOME\n" for i in range(5)).encode() + b"partial \xff"
    assert printed == expected and code == 0
    job = status(target, job_id)
    assert job["state"] == "SUCCEEDED" and job["exit_code"] == 0
    assert job["slurm"]["job_id"] == submitted["slurm_job_id"] and job["slurm"]["node"] == "node1"
    assert cluster.wait_job_state(submitted["slurm_job_id"], {"COMPLETED", "FAILED"}) == "COMPLETED"
    assert run_cli(target, "tail", job_id).stdout == b""  # exactly once: nothing is printed twice
    done = run_cli(target, "results", job_id, "--json")
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout) == {"rows": [{"m": 1, "us": 2.5}]}


def test_failing_payload_exit_code_reaches_runner_and_slurm(target, cluster, tmp_path):
    submitted = submit_json(target, slurm_job(tmp_path / "job.yaml", target,
                                              command=["sh", "-c", "echo boom; exit 3"]))
    printed, code = follow(target, submitted["job_id"])
    assert printed == b"boom\n" and code == 1
    job = status(target, submitted["job_id"])
    assert (job["state"], job["exit_code"]) == ("FAILED", 3)
    slurm_id = submitted["slurm_job_id"]
    assert cluster.wait_job_state(slurm_id, {"COMPLETED", "FAILED"}) == "FAILED"
    assert cluster.job_field(slurm_id, "ExitCode") == "3:0"


def test_unplaceable_job_stays_queued_with_slurms_reason_and_tail_returns_75_in_time(target, cluster, tmp_path):
    # 3 tasks on a node of 2 CPUs: Slurm accepts it and keeps it pending for ever
    submitted = submit_json(target, slurm_job(tmp_path / "job.yaml", target, command=["true"],
                                              slurm={"extra_args": ["--ntasks=3"]}))
    job_id = submitted["job_id"]
    job = wait_state(target, job_id, {"QUEUED"})
    wait_for(lambda: status(target, job_id)["slurm"]["reason"], 30, "Slurm's reason")
    job = status(target, job_id)
    assert job["state"] == "QUEUED" and job["slurm"]["state"] == "PENDING"
    assert job["slurm"]["reason"] not in (None, "", "None") and job["message"] == job["slurm"]["reason"]

    began = time.monotonic()
    done = run_cli(target, "tail", job_id, "-f", "--max-wait", "3")
    took = time.monotonic() - began

    assert done.returncode == EXIT_STILL_RUNNING and done.stdout == b""
    assert took < 3 + 5, f"tail -f --max-wait 3 took {took:.1f} s"
    line = run_cli(target, "status", job_id).stdout.decode()
    assert f"slurm {submitted['slurm_job_id']} PENDING ({job['slurm']['reason']})" in line


def test_cancel_while_pending_ends_it_in_slurm_and_runner(target, cluster, tmp_path):
    hog = submit_json(target, slurm_job(tmp_path / "hog.yaml", target, command=["sleep", "300"],
                                        slurm={"gres": "gpu:2"}))
    wait_state(target, hog["job_id"], {"RUNNING"})
    waiting = submit_json(target, slurm_job(tmp_path / "job.yaml", target, command=["true"],
                                            slurm={"gpus": 1}))
    wait_for(lambda: status(target, waiting["job_id"])["slurm"]["state"] == "PENDING", 30, "PENDING in Slurm")

    done = run_cli(target, "cancel", waiting["job_id"], "--json")

    assert done.returncode == 0, done.stderr.decode()
    job = status(target, waiting["job_id"])
    assert job["state"] == "CANCELLED" and job["supervisor"] is None
    assert cluster.wait_job_state(waiting["slurm_job_id"], {"CANCELLED", "COMPLETED"}) == "CANCELLED"
    assert not (job_dir(target, waiting["job_id"]) / "output.log").exists()  # the payload never ran


def test_cancel_while_running_stops_the_payload(target, cluster, tmp_path):
    pid_file = tmp_path / "payload.pid"
    command = ["sh", "-c", f"echo $$ > '{pid_file}'; echo started; exec sleep 300"]
    submitted = submit_json(target, slurm_job(tmp_path / "job.yaml", target, command=command))
    job_id = submitted["job_id"]
    wait_state(target, job_id, {"RUNNING"})
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 30, "the payload's pid")
    payload = int(pid_file.read_text())

    done = run_cli(target, "cancel", job_id)

    assert done.returncode == 0, done.stderr.decode()
    job = wait_state(target, job_id, {"CANCELLED", "FAILED", "SUCCEEDED", "LOST", "TIMED_OUT"}, timeout=30)
    assert job["state"] == "CANCELLED"
    assert not pid_alive(payload)
    assert cluster.wait_job_state(submitted["slurm_job_id"], {"COMPLETED", "FAILED", "CANCELLED"}) != "RUNNING"


def test_scancel_outside_runner_stops_the_payload_and_says_so(target, cluster, tmp_path):
    pid_file = tmp_path / "payload.pid"
    command = ["sh", "-c", f"echo $$ > '{pid_file}'; exec sleep 300"]
    submitted = submit_json(target, slurm_job(tmp_path / "job.yaml", target, command=command, grace="1s"))
    wait_state(target, submitted["job_id"], {"RUNNING"})
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 30, "the payload's pid")

    cluster.run(["scancel", submitted["slurm_job_id"]], check=True)  # TERM to the batch step: our supervisor

    job = wait_state(target, submitted["job_id"], {"CANCELLED", "FAILED", "SUCCEEDED", "LOST", "TIMED_OUT"}, 30)
    assert job["state"] == "CANCELLED" and "Slurm sent SIGTERM" in job["message"], job
    assert not pid_alive(int(pid_file.read_text()))


def test_our_deadline_ends_the_job_as_timed_out_before_slurms_limit(target, cluster, tmp_path):
    submitted = submit_json(target, slurm_job(tmp_path / "job.yaml", target, command=["sleep", "300"],
                                              max_runtime="3s", grace="1s"))
    assert cluster.job_field(submitted["slurm_job_id"], "TimeLimit") == "00:02:00"
    job = wait_state(target, submitted["job_id"], {"TIMED_OUT", "FAILED", "CANCELLED", "LOST"}, timeout=60)
    assert job["state"] == "TIMED_OUT"
    assert "max_runtime" in job["message"]


def test_two_one_gpu_jobs_run_side_by_side_on_different_gpus(target, cluster, tmp_path):
    # each waits (bounded) for the other's marker: both succeed only if Slurm runs them at the same time
    command = python_payload(tmp_path, "pair.py", f"""
        import os, sys, time
        me = os.environ["RUNNER_JOB_ID"]
        open(os.path.join({str(tmp_path)!r}, "up-" + me), "w").close()
        print("CVD=" + os.environ.get("CUDA_VISIBLE_DEVICES", "none"), flush=True)
        deadline = time.time() + 60
        while len([n for n in os.listdir({str(tmp_path)!r}) if n.startswith("up-")]) < 2:
            if time.time() > deadline:
                sys.exit("the other job never ran beside this one")
            time.sleep(0.1)
    """)
    jobs = [submit_json(target, slurm_job(tmp_path / f"job{k}.yaml", target, command=command, slurm=slurm))
            for k, slurm in enumerate(({"gres": "gpu:1"}, {"gpus": 1}))]
    ended = [wait_state(target, job["job_id"], {"SUCCEEDED", "FAILED", "CANCELLED", "LOST", "TIMED_OUT"})
             for job in jobs]
    assert [job["state"] for job in ended] == ["SUCCEEDED", "SUCCEEDED"]
    assert sorted(job["slurm"]["cuda_visible_devices"] for job in ended) == ["0", "1"]
    outputs = sorted((job_dir(target, job["job_id"]) / "output.log").read_text() for job in jobs)
    assert outputs == ["CVD=0\n", "CVD=1\n"]


def test_slurmctld_restart_mid_job_the_job_finishes_and_status_is_right(target, cluster, tmp_path):
    go = tmp_path / "go"
    command = ["sh", "-c", f"echo waiting; while [ ! -e '{go}' ]; do sleep 0.1; done; echo done"]
    submitted = submit_json(target, slurm_job(tmp_path / "job.yaml", target, command=command))
    job_id = submitted["job_id"]
    wait_state(target, job_id, {"RUNNING"})

    cluster.stop_slurmctld()
    try:
        job = {}

        def asked_the_dead_slurmctld() -> bool:  # a status past the login node's cached view of the job
            job.update(status(target, job_id))
            return bool(job["slurm"].get("error"))

        wait_for(asked_the_dead_slurmctld, timeout=60, what="a status that asked the dead slurmctld")
        assert job["state"] == "RUNNING" and job["slurm"]["error"]
    finally:
        cluster.start_slurmctld()
    go.touch()

    job = wait_state(target, job_id, {"SUCCEEDED", "FAILED", "CANCELLED", "LOST", "TIMED_OUT"})
    assert job["state"] == "SUCCEEDED"
    assert (job_dir(target, job_id) / "output.log").read_text() == "waiting\ndone\n"
    assert cluster.wait_job_state(submitted["slurm_job_id"], {"COMPLETED", "FAILED"}) == "COMPLETED"


def test_gpu_memory_is_checked_inside_the_allocation_and_a_short_card_fails_the_job(target, tmp_path):
    # nvidia-smi here is the test stand-in (tests/hosts/bin): this machine has no GPU. sbatch exports the
    # submitting environment, so the allocation finds it on PATH with its state dir.
    fake = make_state_dir(tmp_path / "gpus")
    write_gpus(fake, total_mib=80000, baseline_used=60000, count=2)
    target.env.update(PATH=f"{STANDIN.parent}:{os.environ['PATH']}", RUNNER_FAKE_GPU_DIR=str(fake))
    spec = dict(slurm={"gres": "gpu:1"}, gpu={"min_free_mib": 30000})
    short = submit_json(target, slurm_job(tmp_path / "short.yaml", target, command=["echo", "ran"], **spec))
    no_gpu = submit_json(target, slurm_job(tmp_path / "none.yaml", target, command=["echo", "ran"],
                                           gpu={"min_free_mib": 30000}))
    ended = {name: wait_state(target, job["job_id"], {"SUCCEEDED", "FAILED", "CANCELLED", "LOST", "TIMED_OUT"})
             for name, job in (("short", short), ("no_gpu", no_gpu))}

    assert ended["short"]["state"] == "FAILED"
    assert "GPU memory is short in the Slurm allocation on node1" in ended["short"]["message"]
    assert "has 19385 MiB free of 80000 MiB, 30000 MiB needed" in ended["short"]["message"]
    assert ended["no_gpu"]["state"] == "FAILED" and "allocation has no GPU" in ended["no_gpu"]["message"]
    for job in (short, no_gpu):
        assert not (job_dir(target, job["job_id"]) / "output.log").exists()  # the payload never ran

    write_gpus(fake, total_mib=80000, baseline_used=0, count=2)
    fits = submit_json(target, slurm_job(tmp_path / "fits.yaml", target, command=["echo", "ran"], **spec))
    job = wait_state(target, fits["job_id"], {"SUCCEEDED", "FAILED", "CANCELLED", "LOST", "TIMED_OUT"})
    assert job["state"] == "SUCCEEDED" and [g["free_mib"] for g in job["gpu"]["before"]] == [79385]


def test_a_supervisor_killed_in_the_allocation_is_reported_lost(target, cluster, tmp_path):
    submitted = submit_json(target, slurm_job(tmp_path / "job.yaml", target, command=["sleep", "300"]))
    job = wait_state(target, submitted["job_id"], {"RUNNING"})

    os.kill(job["supervisor_pid"], signal.SIGKILL)  # one machine: the "compute node" pid is ours to see

    job = wait_state(target, submitted["job_id"], {"SUCCEEDED", "FAILED", "CANCELLED", "LOST", "TIMED_OUT"},
                     timeout=30)
    assert job["state"] == "LOST"
    assert "without writing a final state" in job["message"] and job["slurm"]["state"] == "FAILED"


def test_unknown_partition_is_refused_with_sbatchs_reason_exit_4(target, tmp_path):
    done = run_cli(target, "submit", str(slurm_job(tmp_path / "job.yaml", target, command=["true"],
                                                   slurm={"partition": "nosuch"})))
    assert done.returncode == 4, done.stderr.decode()
    assert "invalid partition specified: nosuch" in done.stderr.decode().lower()
    assert list((target.root / "jobs").iterdir()) == []  # the refused id was never used


def test_a_login_node_without_slurm_or_with_slurmctld_down_is_exit_3(target, cluster, tmp_path):
    job_file = slurm_job(tmp_path / "job.yaml", target, command=["true"])
    done = run_cli(target, "submit", str(job_file), env={"PATH": str(tmp_path / "empty")})
    assert done.returncode == 3, done.stderr.decode()
    assert "sbatch, squeue, scancel not found on the login node's PATH" in done.stderr.decode()

    cluster.stop_slurmctld()
    try:
        began = time.monotonic()
        done = run_cli(target, "submit", str(job_file))
        took = time.monotonic() - began
    finally:
        cluster.start_slurmctld()
    assert done.returncode == 3, done.stderr.decode()
    assert "slurmctld does not answer" in done.stderr.decode() and took < 30
    assert not (target.root / "jobs").exists() or list((target.root / "jobs").iterdir()) == []
