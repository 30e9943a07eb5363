"""A plain job is a list of one variant: the host runs every job's payload through the one variant runner
(remote_payload/supervision/variants.py), so a plain job and a sweep obey the same window, the same cancel
and the same ending record. Where a case once behaved differently for the two, its docstring says how.

The local host with a stand-in nvidia-smi (tests/hosts/bin/nvidia-smi, a test fake); no service is stopped,
so the window counts from the payload's start, as it does for a sweep without a stop.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.cli_helpers import Target, job_dir, python_payload, run_cli, status, submit, wait_for, \
    wait_terminal, write_job

SLEEPER = """\
import json, os, sys, time
seconds, code = float(sys.argv[1]), int(sys.argv[2])
print("variant sleeping", seconds, flush=True)
if sys.argv[3] == "cancel-then-fail":  # a cancel on its way while the payload dies of it (Slurm's TERM does so)
    open(os.path.join(os.environ["RUNNER_JOB_DIR"], "cancel"), "w").close()
    sys.exit(1)
time.sleep(seconds)
with open(os.environ["RUNNER_RESULT"], "w") as fh:
    json.dump({"rows": [{"seconds": seconds}]}, fh)
sys.exit(code)
"""


def job_file(work: Path, target: Target, *, sweep: list | None, seconds: float = 0.2, mode: str = "plain",
             max_runtime: str = "1m", max_downtime: str | None = None) -> Path:
    """The sleeper as a command payload: plain (`seconds`, `mode`), or a sweep over `{s}`/`{m}` includes."""
    command = python_payload(work, "sleeper.py", SLEEPER)
    command += ["{s}", "0", "{m}"] if sweep is not None else [str(seconds), "0", mode]
    path = write_job(work / "job.yaml", target, command=command, max_runtime=max_runtime)
    spec = yaml.safe_load(path.read_text())
    if sweep is not None:
        spec["sweep"] = {"include": sweep}
    if max_downtime is not None:
        spec["limits"]["max_downtime"] = max_downtime
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def events(target: Target, job_id: str) -> list[dict]:
    return [json.loads(line) for line in (job_dir(target, job_id) / "events.jsonl").read_text().splitlines()]


def test_a_plain_job_is_held_to_max_downtime_as_a_sweep_variant_is(work, target):
    """limits.max_downtime is the window's bound for any job: a payload still running at the window's end is
    stopped (before: a plain job ignored it and ran its 30 s to SUCCEEDED)."""
    job_id = submit(target, job_file(work, target, sweep=None, seconds=30, max_downtime="3s"))
    job = wait_terminal(target, job_id, timeout=60)
    assert job["state"] == "TIMED_OUT", job
    assert "limits.max_downtime (3s)" in job["message"], job
    assert job["exit_code"] in (143, 137), job


def test_the_first_variant_starts_when_max_runtime_is_longer_than_the_window(work, target):
    """Nothing measured yet: the first variant starts and is bounded by the window's end; later ones by the
    longest so far (before: judged by limits.max_runtime, 1 m > 30 s, every variant was SKIPPED after the stop,
    an outage for nothing)."""
    sweep = [{"s": 0.2, "m": "run"}, {"s": 0.3, "m": "run"}]
    job_id = submit(target, job_file(work, target, sweep=sweep, max_runtime="1m", max_downtime="30s"))
    job = wait_terminal(target, job_id, timeout=60)
    assert job["state"] == "SUCCEEDED", job
    result = json.loads(run_cli(target, "results", job_id, "--json").stdout)
    assert [v["status"] for v in result["variants"]] == ["ended", "ended"], result


def test_a_plain_job_with_max_downtime_whose_payload_fits_succeeds(work, target):
    job_id = submit(target, job_file(work, target, sweep=None, seconds=0.2, max_runtime="1m", max_downtime="30s"))
    job = wait_terminal(target, job_id, timeout=60)
    assert job["state"] == "SUCCEEDED", job
    assert json.loads(run_cli(target, "results", job_id, "--json").stdout) == {"rows": [{"seconds": 0.2}]}


@pytest.mark.parametrize("sweep", [None, [{"s": 0, "m": "cancel-then-fail"}],
                                   [{"s": 0, "m": "cancel-then-fail"}, {"s": 0.2, "m": "run"}]],
                         ids=["plain", "sweep-of-one", "sweep-of-two"])
def test_a_payload_failing_as_a_cancel_arrives_ends_the_job_cancelled(work, target, sweep):
    """The payload exits 1 with a cancel on its way: the job ends CANCELLED, plain or sweep, and no further
    variant starts. (The sweep's loop used to look for the cancel only before it polled its variants, so one
    that failed in between ended FAILED; that window is too narrow to hit from here on purpose: this holds
    the outcome, the re-check after a failed variant is in variants.wait_for_ends.)"""
    path = job_file(work, target, sweep=sweep, mode="cancel-then-fail")
    job = wait_terminal(target, submit(target, path), timeout=60)
    assert job["state"] == "CANCELLED", job
    starts = [e for e in events(target, job["job_id"]) if e["event"] == "variant" and e["status"] == "start"]
    assert len(starts) == (1 if sweep else 0), starts  # a plain job announces no variant


@pytest.mark.parametrize("sweep", [None, [{"s": 30, "m": "run"}, {"s": 0.2, "m": "run"}]], ids=["plain", "sweep"])
def test_a_cancel_records_the_jobs_ending_before_the_payload_is_stopped(work, target, sweep):
    """A cancel decides the job's end at once: TERMINATING with `ending` (what a restorer reads if the
    supervisor dies during the stop: the state to record and how much grace is left), plain or sweep
    (before: a sweep went straight from RUNNING to its final state, with no `ending`)."""
    job_id = submit(target, job_file(work, target, sweep=sweep, seconds=30))
    log = job_dir(target, job_id) / "output.log"  # made by the supervisor, which may not have run yet
    wait_for(lambda: log.exists() and b"variant sleeping" in log.read_bytes(), timeout=30,
             what="the payload running")
    assert run_cli(target, "cancel", job_id).returncode == 0
    job = wait_terminal(target, job_id, timeout=60)
    assert job["state"] == "CANCELLED", job
    states = [e["state"] for e in events(target, job_id) if e["event"] == "state"]
    assert "TERMINATING" in states and states.index("TERMINATING") > states.index("RUNNING"), states
    assert job["ending"]["state"] == "CANCELLED" and job["ending"]["at"], job


def test_a_plain_jobs_result_is_the_payloads_own_document(work, target):
    """One variant without a sweep is presented as the payload itself: result.json is what it wrote, and its
    log carries no variant lines."""
    job_id = submit(target, job_file(work, target, sweep=None, seconds=0.1))
    job = wait_terminal(target, job_id, timeout=60)
    assert job["state"] == "SUCCEEDED", job
    assert json.loads((job_dir(target, job_id) / "result.json").read_text()) == {"rows": [{"seconds": 0.1}]}
    assert b'"event": "variant"' not in (job_dir(target, job_id) / "output.log").read_bytes()
    assert not (job_dir(target, job_id) / "results").exists()
    assert status(target, job_id)["exit_code"] == 0
