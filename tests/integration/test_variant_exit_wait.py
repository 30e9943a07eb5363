"""A sweep's variant is seen to end when its process exits (a pidfd), not at the next tick of the 0.1 s
poll: the seconds recorded for a variant that exits after 0.04 s are the process's, not the poll's."""
from __future__ import annotations

import json
import shutil
import statistics

import yaml

from remote_payload.host.processes import POLL_S
from tests.cli_helpers import local_target, submit, wait_terminal, write_job
from tests.hosts._proc import shared_tmpdir

VARIANTS = 30


def test_variants_that_exit_at_once_are_recorded_at_their_exit():
    target, work = local_target(), shared_tmpdir("runner-exit-wait-")
    try:
        path = write_job(work / "sweep.yaml", target, command=["sh", "-c", "sleep 0.04 # {n}"])
        spec = yaml.safe_load(path.read_text())
        spec["sweep"] = {"matrix": {"n": list(range(VARIANTS))}}
        path.write_text(yaml.safe_dump(spec))
        job = wait_terminal(target, submit(target, path))
        assert job["state"] == "SUCCEEDED", job
        variants = json.loads((target.root / "jobs" / job["job_id"] / "result.json").read_text())["variants"]
        seconds = [v["seconds"] for v in variants]
        assert len(seconds) == VARIANTS
        # The poll put each one that outlived its launch at POLL_S or more; seen at its exit, it is ~0.04 s.
        assert statistics.median(seconds) < POLL_S * 0.9, seconds
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(target.root, ignore_errors=True)
