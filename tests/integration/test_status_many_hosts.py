"""`runner status` with no id asks every host its jobs are on: one host that cannot be reached is that host's
line (exit 3 unless something ended badly), never a blank for every job."""
from __future__ import annotations

import json
import socket
import time

from runner.state.store import JobRecord, Store
from tests.cli_helpers import Target, run_cli, wait_for, write_job


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed once the socket is: connects are refused at once


def test_an_unreachable_host_is_its_own_line(tmp_path):
    target = Target("local", {"address": "local", "root": str(tmp_path / "root")}, tmp_path / "root", {})
    job = write_job(tmp_path / "job.yaml", target, command=["true"])
    submitted = run_cli(target, "submit", str(job), "--job-id", "here-1")
    assert submitted.returncode == 0, submitted.stderr
    wait_for(lambda: run_cli(target, "status", "here-1").returncode == 0, what="here-1 SUCCEEDED")
    gone = {"address": "127.0.0.1", "port": closed_port(), "transport": "paramiko", "connect_timeout": 2}
    Store().save(JobRecord(job_id="there-1", name="t", host=gone, spec_path="x.yaml", submitted_at=time.time(),
                           last_state="RUNNING"))
    done = run_cli(target, "status", timeout=60)
    out, err = done.stdout.decode(), done.stderr.decode()
    assert "here-1: SUCCEEDED" in out, (out, err)
    assert "there-1" in out and "unreachable" in out, (out, err)
    assert done.returncode == 3, (done.returncode, out, err)
    as_json = run_cli(target, "status", "--json", timeout=60)
    rows = {row["job_id"]: row for row in json.loads(as_json.stdout)}
    assert rows["here-1"]["state"] == "SUCCEEDED"
    assert rows["there-1"]["error"] == "host-unreachable" and rows["there-1"]["state"] == "RUNNING"


def test_one_job_on_an_unreachable_host_is_still_exit_3(tmp_path):
    target = Target("local", {"address": "local", "root": str(tmp_path / "root")}, tmp_path / "root", {})
    gone = {"address": "127.0.0.1", "port": closed_port(), "transport": "paramiko", "connect_timeout": 2}
    Store().save(JobRecord(job_id="there-2", name="t", host=gone, spec_path="x.yaml", submitted_at=time.time()))
    done = run_cli(target, "status", "there-2", timeout=60)
    assert done.returncode == 3 and b"Traceback" not in done.stderr, done.stderr
