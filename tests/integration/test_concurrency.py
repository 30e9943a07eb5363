"""Ten `runner submit` processes at once against one host and one service (the confined systemd host).

Without --queue exactly one is accepted and nine exit 5 naming it; with --queue all ten run, one after
another: each payload stamps its start and end time, and no two intervals overlap. The service ends
active and healthy either way.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from remote_payload.contract import TERMINAL
from tests.case_report import record
from tests.cli_helpers import REPO, Target, python_payload, run_cli, wait_for, wait_terminal, write_job

pytestmark = pytest.mark.systemd

SUBMITTERS = 10

STAMPED = """
import os, sys, time
stamps, gate = sys.argv[1], sys.argv[2]
def stamp(what):
    with open(stamps, "a") as fh:  # one short O_APPEND write a line: lines never interleave
        fh.write("%s %s %.6f\\n" % (os.environ["RUNNER_JOB_ID"], what, time.time()))
stamp("start")
while gate != "-" and not os.path.exists(gate):
    time.sleep(0.05)
time.sleep(0.3)
stamp("end")
"""


def target_for(host) -> Target:
    return Target("ssh", {"address": host.alias}, Path("/root/.runner"), {"RUNNER_SSH_CONFIG": str(host.ssh_config)},
                  host)


@pytest.fixture
def quick_unit(service_host):
    """The dummy unit with short start/stop delays: ten stop/start cycles stay cheap (reset restores it)."""
    service_host.install_unit(ready_delay=0.2, release_delay=0.1)
    service_host.systemctl("restart", service_host.unit).check_returncode()
    wait_for(lambda: service_host.health_status() == 200, what="unit healthy")
    return service_host


def stamped_job(work: Path, host, gate: str) -> Path:
    command = python_payload(work, "stamped.py", STAMPED) + [str(work / "stamps"), gate]
    service = {"manager": "systemd", "unit": host.unit, "stop": "always", "health_url": host.health_url,
               "health_timeout": "30s"}
    return write_job(work / "job.yaml", target_for(host), command=command, service=service, max_runtime="2m",
                     grace="2s")


def submit_all_at_once(target: Target, job_file: Path, *extra: str) -> list[subprocess.CompletedProcess]:
    env = {**os.environ, **target.env}
    argv = [sys.executable, "-m", "runner", "submit", str(job_file), "--json", *extra]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
             for _ in range(SUBMITTERS)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        results.append(subprocess.CompletedProcess(argv, proc.returncode, out, err))
    return results


def service_back(host) -> tuple[str, bool]:
    now = host.service_state()
    return now, now == "active" and host.health_status() == 200


def test_ten_simultaneous_submits_one_accepted_nine_told_the_holder(quick_unit, work):
    host, target, gate = quick_unit, target_for(quick_unit), work / "gate"
    results = submit_all_at_once(target, stamped_job(work, host, str(gate)))
    accepted = [json.loads(r.stdout)["job_id"] for r in results if r.returncode == 0]
    busy = [r.stderr.decode() + r.stdout.decode() for r in results if r.returncode == 5]  # --json: on stdout
    gate.touch()
    job = wait_terminal(target, accepted[0]) if accepted else None
    now, healthy = service_back(host)
    named = sum(1 for message in busy if accepted and accepted[0] in message)
    record(f"{SUBMITTERS} simultaneous submits: {len(accepted)} accepted, {len(busy)} exit 5, {named} name the holder",
           job, expected="SUCCEEDED", service_now=now, healthy=healthy)
    assert len(accepted) == 1, [(r.returncode, r.stderr.decode()) for r in results]
    assert len(busy) == SUBMITTERS - 1, [(r.returncode, r.stderr.decode()) for r in results]
    for message in busy:
        assert accepted[0] in message, f"busy message does not name the holder {accepted[0]}: {message}"
    assert job["state"] == "SUCCEEDED" and healthy, (job, now)
    assert (work / "stamps").read_text().count(" start ") == 1  # the refused nine never ran


def wait_all_terminal(target: Target, count: int, timeout: float = 150) -> list[dict]:
    def all_done() -> bool:
        done = run_cli(target, "status", "--json")
        jobs = json.loads(done.stdout) if done.stdout.strip().startswith(b"[") else []  # exit is by state
        return len(jobs) == count and all(job["state"] in TERMINAL for job in jobs)

    wait_for(all_done, timeout=timeout, what=f"{count} queued jobs to end")
    return json.loads(run_cli(target, "status", "--json").stdout)


def intervals(stamps: Path) -> list[tuple[float, float, str]]:
    """(start, end, job id) per payload run, sorted by start."""
    times: dict[str, dict[str, float]] = {}
    for line in stamps.read_text().splitlines():
        job_id, what, at = line.split()
        assert what not in times.setdefault(job_id, {}), f"{job_id} stamped {what} twice"
        times[job_id][what] = float(at)
    return sorted((t["start"], t["end"], job_id) for job_id, t in times.items())


@pytest.mark.slow(seconds=30)
def test_ten_simultaneous_submits_with_queue_run_one_after_another(quick_unit, work):
    host, target = quick_unit, target_for(quick_unit)
    results = submit_all_at_once(target, stamped_job(work, host, "-"), "--queue")
    assert [r.returncode for r in results] == [0] * SUBMITTERS, [r.stderr.decode() for r in results]
    jobs = wait_all_terminal(target, SUBMITTERS)
    runs = intervals(work / "stamps")
    now, healthy = service_back(host)
    last = max(jobs, key=lambda job: job.get("ended_at") or 0)
    overlaps = sum(1 for before, after in zip(runs, runs[1:]) if after[0] < before[1])
    record(f"{SUBMITTERS} simultaneous submits with --queue: {len(runs)} ran, {overlaps} overlaps "
           "(payload timestamps)", last, expected="SUCCEEDED", service_now=now, healthy=healthy)
    assert sorted(job["state"] for job in jobs) == ["SUCCEEDED"] * SUBMITTERS, jobs
    assert len(runs) == SUBMITTERS
    for before, after in zip(runs, runs[1:]):
        assert after[0] >= before[1], f"{after[2]} started at {after[0]:.3f}, {before[2]} ran until {before[1]:.3f}"
    assert healthy, f"service {now}"
