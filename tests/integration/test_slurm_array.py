"""A sweep on Slurm is one job array: `sbatch --array=0-(N-1)%k`, one task per variant.

First the pure parts (the combined log, the array's outcome and progress), then the spec (sweep.max_parallel,
limits.max_downtime refused on Slurm: exit 2, no host contacted), then the real thing on the test cluster
(tests/hosts/slurm_cluster.py) with TWO nodes of 2 CPUs and 2 GPUs each: four 1-CPU tasks could all run at
once there, so only `%2` keeps them to two.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from remote_payload.host.answer import Fail
from remote_payload.slurm.array import array_progress, combined_chunk, sweep_outcome
from remote_payload.supervision.spec import check_spec
from runner.spec.spec import JobSpec
from tests.cli_helpers import Target, job_dir, pid_alive, python_payload, run_cli, status, submit_refused, wait_for
from tests.harness.slurm_jobs import follow, slurm_job, slurm_target, submit_json, wait_state
from tests.hosts.prereqs import require
from tests.hosts.slurm_cluster import missing_prerequisites, start_slurm_cluster

ENDED = {"SUCCEEDED", "FAILED", "CANCELLED", "LOST", "TIMED_OUT"}


# -- the pure parts ------------------------------------------------------------------------------------------

def test_the_combined_log_is_each_variants_log_in_order_and_never_serves_past_an_unfinished_one(tmp_path):
    a, b, c = (tmp_path / name for name in "abc")
    a.write_bytes(b"A1\nA2\n")
    b.write_bytes(b"B1\n")
    c.write_bytes(b"C\n")  # variant 3 is done already; it waits behind variant 2
    segments = [(str(a), True), (str(b), False), (str(c), True)]
    assert combined_chunk(segments, 0, 100) == (b"A1\nA2\nB1\n", 9)
    assert combined_chunk(segments, 0, 4) == (b"A1\nA", 9)
    with b.open("ab") as fh:
        fh.write(b"B2 partial")
    assert combined_chunk(segments, 9, 100) == (b"B2 partial", 19)
    with b.open("ab") as fh:
        fh.write(b"\n")
    segments[1] = (str(b), True)
    assert combined_chunk(segments, 19, 100) == (b"\nC\n", 22)
    served = b"".join(combined_chunk(segments, offset, 3)[0] for offset in range(0, 22, 3))
    assert served == a.read_bytes() + b.read_bytes() + c.read_bytes()  # every byte once, in variant order
    missing = [(str(tmp_path / "never-started"), True), (str(c), False)]
    assert combined_chunk(missing, 0, 100) == (b"C\n", 2)  # a variant with no log at all adds nothing


def record(index, state, status="ended", exit_code=0):
    return {"index": index, "args": {"n": index}, "status": status, "state": state, "exit_code": exit_code}


def test_the_arrays_outcome_is_the_single_host_sweeps():
    ok = [record(k, "SUCCEEDED") for k in (1, 2, 3)]
    assert sweep_outcome(ok, cancel_requested=False)[0::2] == ("SUCCEEDED", 0)
    state, message, exit_code = sweep_outcome([ok[0], record(2, "FAILED", exit_code=3), ok[2]], False)
    assert (state, exit_code) == ("FAILED", 1) and message == "sweep: 2 succeeded, 1 failed, 0 skipped of 3 variants"
    lost = sweep_outcome([ok[0], record(2, "LOST", exit_code=None), ok[2]], False)
    assert lost[0] == "FAILED" and "variant 2 LOST" in lost[1]
    stopped = [ok[0], record(2, "CANCELLED", exit_code=143), record(3, "CANCELLED", "skipped", None)]
    state, message, exit_code = sweep_outcome(stopped, cancel_requested=True)
    assert (state, exit_code) == ("CANCELLED", 1) and "1 succeeded, 1 failed, 1 skipped of 3" in message
    assert sweep_outcome(stopped, cancel_requested=False)[0] == "CANCELLED"  # scancel of the array outside runner
    failed_then_cancelled = [record(1, "FAILED", exit_code=3), stopped[1], stopped[2]]
    assert sweep_outcome(failed_then_cancelled, cancel_requested=False)[0] == "FAILED"


def test_progress_counts_done_running_and_pending_with_slurms_reasons():
    tasks = [{"state": "SUCCEEDED", "closed": True, "reason": None},
             {"state": "FAILED", "closed": True, "reason": None},
             {"state": "RUNNING", "closed": False, "reason": None},
             {"state": "QUEUED", "closed": False, "reason": "JobArrayTaskLimit"},
             {"state": "QUEUED", "closed": False, "reason": "JobArrayTaskLimit"},
             {"state": "QUEUED", "closed": False, "reason": None}]
    assert array_progress(tasks) == {"of": 6, "done": 2, "succeeded": 1, "failed": 1, "skipped": 0, "running": 1,
                                     "pending": 3, "reasons": {"JobArrayTaskLimit": 2}}


# -- the spec: sweep.max_parallel, and what a sweep on Slurm refuses ------------------------------------------

BASE = {"name": "sweep on slurm", "host": {"address": "login-1"}, "launcher": "slurm",
        "payload": {"command": ["python3", "bench.py", "--n", "{n}"]}, "limits": {"max_runtime": "30m"},
        "sweep": {"matrix": {"n": [1, 2, 3, 4]}}}


def spec(**changes) -> JobSpec:
    return JobSpec.model_validate({**BASE, **changes})


def test_the_wire_form_carries_max_parallel_and_the_host_accepts_it():
    wire = spec(sweep={"matrix": {"n": [1, 2, 3, 4]}, "max_parallel": 2}).to_wire("j-1", 0, None)
    assert wire["sweep"]["max_parallel"] == 2 and len(wire["sweep"]["variants"]) == 4
    assert check_spec(wire, "j-1")["sweep"]["max_parallel"] == 2
    assert spec().to_wire("j-1", 0, None)["sweep"]["max_parallel"] == 4  # default: every variant may run at once
    ssh = spec(launcher="ssh").to_wire("j-1", 0, None)
    assert "max_parallel" not in ssh["sweep"]  # a single-host sweep's wire form is as it was


@pytest.mark.parametrize("changes, words", [
    ({"sweep": {"fail_fast": False, "max_parallel": 0, "variants": [{"args": {}, "argv": ["x"]}]}},
     "sweep.max_parallel"),
    ({"limits": {"max_runtime": 60, "grace": 5, "prepare_timeout": 60, "queue_timeout": 0, "max_downtime": 30}},
     "limits.max_downtime"),
])
def test_the_host_refuses_what_the_controller_refuses(changes, words):
    wire = dict(spec().to_wire("j-1", 0, None), **changes)
    with pytest.raises(Fail) as caught:
        check_spec(wire, "j-1")
    assert caught.value.code == "bad-spec" and words in str(caught.value)


@pytest.mark.parametrize("changes, words", [
    ({"sweep": {"matrix": {"n": [1]}, "max_parallel": 0}}, "sweep.max_parallel"),
    ({"sweep": {"matrix": {"n": [1]}, "max_parallel": -2}}, "sweep.max_parallel"),
    ({"sweep": {"matrix": {"n": [1]}, "max_parallel": True}}, "sweep.max_parallel"),
    ({"sweep": {"matrix": {"n": [1]}, "max_parallel": 2}, "launcher": "ssh"}, "sweep.max_parallel"),
    ({"limits": {"max_runtime": "30m", "max_downtime": "10m"}}, "limits.max_downtime"),
])
def test_bad_array_specs_exit_2_naming_the_field_and_reach_no_host(changes, words, tmp_path):
    assert words in submit_refused(tmp_path, {**BASE, "host": {"address": "local", "root": str(tmp_path / "never")},
                                              **changes})
    with pytest.raises(ValidationError):
        JobSpec.model_validate({**BASE, **changes})


# -- on the real cluster ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    require(missing_prerequisites())
    started = start_slurm_cluster(nodes=2)
    yield started
    started.stop()


@pytest.fixture
def target(cluster):
    """A fresh host.root per test; every Slurm job ended afterwards."""
    yield slurm_target(cluster)
    cluster._cancel_all_jobs()


def array_job(path: Path, target: Target, command: list[str], sweep: dict, payload_env: dict | None = None,
              **extra) -> Path:
    slurm_job(path, target, command=command, **extra)
    spec = yaml.safe_load(path.read_text())
    spec["sweep"] = sweep
    spec["payload"]["env"] = payload_env or {}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def stamped_payload(directory: Path, seconds: float) -> list[str]:
    """Variant {n}: records its start and end time on the shared filesystem, prints three lines, writes a
    result row; variant 2 exits 3 when FAIL_2 is in its environment."""
    return python_payload(directory, "variant.py", f"""
        import json, os, sys, time
        n, marks = sys.argv[1], sys.argv[2]
        open(os.path.join(marks, "start-" + n), "w").write(repr(time.time()))
        for i in range(3):
            print(f"variant {{n}} line {{i}}", flush=True)
            time.sleep({seconds} / 3)
        open(os.path.join(marks, "end-" + n), "w").write(repr(time.time()))
        json.dump({{"rows": [{{"n": int(n), "us": 10.0 * int(n)}}]}}, open(os.environ["RUNNER_RESULT"], "w"))
        sys.exit(3 if n == "2" and os.environ.get("FAIL_2") else 0)
    """) + ["{n}", str(directory)]


def most_at_once(marks: Path, n: int) -> int:
    """The largest number of variants whose [start, end] intervals overlap, from their own timestamps."""
    edges = []
    for k in range(1, n + 1):
        edges += [(float((marks / f"start-{k}").read_text()), 1), (float((marks / f"end-{k}").read_text()), -1)]
    running = peak = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):  # an end before a start at the same instant
        running += step
        peak = max(peak, running)
    return peak


@pytest.mark.slow(seconds=25)
def test_four_variants_two_at_a_time_one_table_and_the_log_exactly_once(target, cluster, tmp_path):
    command = stamped_payload(tmp_path, seconds=6)
    submitted = submit_json(target, array_job(tmp_path / "job.yaml", target, command,
                                              {"matrix": {"n": [1, 2, 3, 4]}, "max_parallel": 2}))
    job_id, slurm_id = submitted["job_id"], submitted["slurm_job_id"]
    assert cluster.job_field(f"{slurm_id}_3", "ArrayTaskThrottle") == "2"

    samples, seen_text = [], []

    def waiting_tasks_shown() -> bool:
        samples.append(len(cluster.run(["squeue", "-h", "-r", "-t", "R", "-j", slurm_id, "-o", "%i"]).stdout.split()))
        text = run_cli(target, "status", job_id).stdout.decode()
        seen_text.append(text)
        return "pending (JobArrayTaskLimit" in text

    wait_for(waiting_tasks_shown, 30, "status to show the tasks the throttle holds back")
    assert "of 4 done" in seen_text[-1] and f"slurm {slurm_id}" in seen_text[-1]
    printed, code = follow(target, job_id)
    samples.append(len(cluster.run(["squeue", "-h", "-r", "-t", "R", "-j", slurm_id, "-o", "%i"]).stdout.split()))

    assert code == 0
    job = status(target, job_id)
    assert (job["state"], job["exit_code"]) == ("SUCCEEDED", 0)
    assert max(samples) <= 2 and most_at_once(tmp_path, 4) == 2
    assert job["array"]["of"] == 4 and job["array"]["succeeded"] == 4
    # each variant its own Slurm task, allocation, process and log; the tail is their logs in variant order
    logs = [(job_dir(target, job_id) / f"variant-{k}" / "output.log").read_bytes() for k in range(1, 5)]
    assert printed == b"".join(logs)
    for k, log in enumerate(logs, 1):
        lines = log.decode().splitlines()
        first, last = json.loads(lines[0]), json.loads(lines[-1])
        assert (first["event"], first["index"], first["of"], first["status"]) == ("variant", k, 4, "start")
        assert (last["event"], last["index"], last["status"], last["exit_code"]) == ("variant", k, "end", 0)
        assert lines[1:-1] == [f"variant {k} line {i}" for i in range(3)]
        assert cluster.job_field(f"{slurm_id}_{k - 1}", "JobState") == "COMPLETED"
    assert run_cli(target, "tail", job_id).stdout == b""  # exactly once
    done = run_cli(target, "results", job_id)
    assert done.returncode == 0, done.stderr.decode()
    table = done.stdout.decode()
    assert "sweep: 4 succeeded, 0 failed, 0 skipped of 4 variants" in table
    assert all(f"n={k}" in table for k in range(1, 5))
    result = json.loads(run_cli(target, "results", job_id, "--json").stdout)
    assert [v["result"]["rows"][0]["n"] for v in result["variants"]] == [1, 2, 3, 4]
    assert all(v["columns"] == ["n", "us"] for v in result["variants"])
    plotted = run_cli(target, "results", job_id, "--plot", str(tmp_path / "plot.png"))
    assert plotted.returncode == 0, plotted.stderr.decode()
    assert (tmp_path / "plot.png").stat().st_size > 0


def test_a_failing_variant_fails_the_job_as_on_one_host_and_slurm_has_its_exit_code(target, cluster, tmp_path):
    command = stamped_payload(tmp_path, seconds=0.3)
    submitted = submit_json(target, array_job(tmp_path / "job.yaml", target, command,
                                              {"matrix": {"n": [1, 2, 3]}, "max_parallel": 2},
                                              payload_env={"FAIL_2": "1"}))
    job = wait_state(target, submitted["job_id"], ENDED)
    assert (job["state"], job["exit_code"]) == ("FAILED", 1)
    assert "sweep: 2 succeeded, 1 failed, 0 skipped of 3 variants" in job["message"]
    slurm_id = submitted["slurm_job_id"]
    assert cluster.wait_job_state(f"{slurm_id}_1", {"COMPLETED", "FAILED"}) == "FAILED"
    assert cluster.job_field(f"{slurm_id}_1", "ExitCode") == "3:0"
    assert cluster.job_field(f"{slurm_id}_0", "JobState") == "COMPLETED"
    table = run_cli(target, "results", submitted["job_id"]).stdout.decode()
    assert "exit 3" in table and table.count("exit 0") == 2


def test_fail_fast_starts_no_variant_after_a_failure(target, cluster, tmp_path):
    command = stamped_payload(tmp_path, seconds=0.3)
    submitted = submit_json(target, array_job(tmp_path / "job.yaml", target, command,
                                              {"include": [{"n": 2}, {"n": 1}, {"n": 3}], "max_parallel": 1,
                                               "fail_fast": True}, payload_env={"FAIL_2": "1"}))
    job = wait_state(target, submitted["job_id"], ENDED)
    assert job["state"] == "FAILED" and "0 succeeded, 1 failed, 2 skipped of 3" in job["message"]
    result = json.loads(run_cli(target, "results", submitted["job_id"], "--json").stdout)
    assert [v["status"] for v in result["variants"]] == ["ended", "skipped", "skipped"]
    assert "variant 1 failed and sweep.fail_fast is set" in result["variants"][1]["reason"]
    assert not (tmp_path / "start-1").exists() and not (tmp_path / "start-3").exists()


def test_cancel_of_a_running_array_ends_every_task(target, cluster, tmp_path):
    command = ["sh", "-c", f"echo $$ > '{tmp_path}/pid-{{n}}'; echo started {{n}}; exec sleep 300"]
    submitted = submit_json(target, array_job(tmp_path / "job.yaml", target, command,
                                              {"matrix": {"n": [1, 2, 3, 4]}, "max_parallel": 2}))
    job_id, slurm_id = submitted["job_id"], submitted["slurm_job_id"]
    wait_for(lambda: len(list(tmp_path.glob("pid-*"))) == 2, 30, "two variants running")
    pids = [int(p.read_text()) for p in tmp_path.glob("pid-*")]

    done = run_cli(target, "cancel", job_id)

    assert done.returncode == 0, done.stderr.decode()
    job = wait_state(target, job_id, ENDED, timeout=40)
    assert job["state"] == "CANCELLED" and job["array"]["done"] == 4
    assert not any(pid_alive(pid) for pid in pids)
    assert len(list(tmp_path.glob("pid-*"))) == 2  # the two waiting variants never started
    wait_for(lambda: not cluster.run(["squeue", "-h", "-r", "-t", "PD,R,CG,S", "-j", slurm_id, "-o", "%i"]).stdout.strip(),
             30, "no task of the array left in Slurm")
    result = json.loads(run_cli(target, "results", job_id, "--json").stdout)
    assert sorted(v["status"] for v in result["variants"]) == ["ended", "ended", "skipped", "skipped"], result
    printed, code = follow(target, job_id, limit=20)
    assert code == 1 and printed.count(b'"status": "skipped"') == 2


def test_dry_run_says_the_sweep_is_one_job_array_not_a_downtime_window(target, tmp_path):
    path = array_job(tmp_path / "job.yaml", target, stamped_payload(tmp_path, seconds=0.3),
                     {"matrix": {"n": [1, 2, 3]}, "max_parallel": 2})
    done = run_cli(target, "submit", str(path), "--dry-run")
    text = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "3 variants as one Slurm job array, at most 2 at once" in text and "downtime window" not in text, text
