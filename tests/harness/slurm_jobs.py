"""Jobs on the real Slurm test cluster (tests/hosts/slurm_cluster.py) through the `runner` CLI: the login node's
target, a job file, submit, follow, and waiting for a state."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import yaml

from tests.cli_helpers import Target, run_cli, status, wait_for

EXIT_STILL_RUNNING = 75


def slurm_target(cluster) -> Target:
    """The cluster's login node (`local`) with a fresh host.root on the cluster's "shared" filesystem."""
    root = Path(f"{cluster.base}/runner root {time.monotonic_ns()}")
    root.mkdir()
    host = {"address": "local", "root": str(root), "python": sys.executable}
    return Target(kind="slurm", host=host, root=root, env={"SLURM_CONF": str(cluster.conf)})


def slurm_job(path: Path, target: Target, *, command: list[str], slurm: dict | None = None,
              max_runtime: str = "2m", grace: str = "2s", **extra) -> Path:
    spec = {"name": "slurm job", "host": target.host, "launcher": "slurm", "slurm": slurm or {},
            "payload": {"command": command}, "limits": {"max_runtime": max_runtime, "grace": grace}, **extra}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def submit_json(target: Target, job_file: Path) -> dict:
    done = run_cli(target, "submit", str(job_file), "--json")
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


def follow(target: Target, job_id: str, limit: float = 90) -> tuple[bytes, int]:
    """`tail -f` again while it says 75 (bounded); everything it printed, and its last exit code."""
    printed, deadline = b"", time.monotonic() + limit
    while True:
        done = run_cli(target, "tail", job_id, "-f", "--max-wait", "10")
        printed += done.stdout
        if done.returncode != EXIT_STILL_RUNNING or time.monotonic() > deadline:
            return printed, done.returncode


def wait_state(target: Target, job_id: str, states: set[str], timeout: float = 90) -> dict:
    seen = {}

    def reached() -> bool:
        seen.update(status(target, job_id))
        return seen["state"] in states

    wait_for(reached, timeout, f"{job_id} to reach {sorted(states)}")
    return seen
