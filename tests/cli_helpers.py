"""Helpers for tests that drive the real `runner` CLI as a separate process, as a user or an agent would."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from remote_payload.contract import is_terminal

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Target:
    """Where jobs go: `host` is the spec's host section; `root` is the host-side ROOT as seen from here."""

    kind: str
    host: dict
    root: Path
    env: dict
    ssh_host: object = None  # tests.hosts.sshd.SshHost for ssh targets: PIDs there live in its namespace


def local_target(env: dict | None = None) -> Target:
    """The local host (`host.address: local`) with a ROOT of its own that any local user may read."""
    from tests.hosts._proc import shared_tmpdir

    root = shared_tmpdir("runner-root-")
    return Target("local", {"address": "local", "root": str(root)}, root, env or {})


def run_cli(target: Target, *args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **target.env, **(env or {})}
    return subprocess.run([sys.executable, "-m", "runner", *args], capture_output=True, timeout=timeout,
                          env=full_env, cwd=REPO)


def write_job(path: Path, target: Target, *, command: list[str] | None = None, script: str | None = None,
              name: str = "test job", max_runtime: str = "5m", grace: str = "2s", env: dict | None = None,
              args: dict | None = None, service: dict | None = None, gpu: dict | None = None) -> Path:
    payload: dict = {"env": env or {}}
    if command is not None:
        payload["command"] = command
    else:
        payload["script"] = script
        payload["args"] = args or {}
    spec = {"name": name, "host": target.host, "service": service or {"manager": "none"},
            "payload": payload, "limits": {"max_runtime": max_runtime, "grace": grace}}
    if gpu:
        spec["gpu"] = gpu
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def python_payload(directory: Path, name: str, body: str) -> list[str]:
    """Write a payload script readable by any local user; return its command argv."""
    path = directory / name
    path.write_text(textwrap.dedent(body))
    path.chmod(0o755)
    return ["python3", str(path)]


def submit(target: Target, job_file: Path, *extra: str) -> str:
    done = run_cli(target, "submit", str(job_file), "--json", *extra)
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)["job_id"]


def status(target: Target, job_id: str) -> dict:
    """The job's status; the exit code must be the one its state maps to (0 SUCCEEDED, 1 ended otherwise,
    75 still running)."""
    done = run_cli(target, "status", job_id, "--json")
    job = json.loads(done.stdout) if done.stdout.strip().startswith(b"{") else {}
    expected = (0 if job.get("state") == "SUCCEEDED" else 1) if is_terminal(job.get("state", "")) else 75
    assert job.get("job_id") == job_id and done.returncode == expected, (done.returncode, done.stdout, done.stderr)
    return job


def wait_terminal(target: Target, job_id: str, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        asked = time.monotonic()
        job = status(target, job_id)
        if is_terminal(job["state"]):
            return job
        time.sleep(paced(time.monotonic() - asked, 0.3))
    raise AssertionError(f"{job_id} not terminal after {timeout}s: {job}")


def job_dir(target: Target, job_id: str) -> Path:
    return target.root / "jobs" / job_id


def wait_for(predicate, timeout: float = 60, what: str = "condition") -> None:
    """Until `predicate()` holds; an AssertionError past `timeout`. The default bounds progress ("X running"),
    never a claim about time: generous, for a loaded CI box (a test that proves a bound passes its own)."""
    deadline = time.monotonic() + timeout
    while True:
        asked = time.monotonic()
        if predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(paced(time.monotonic() - asked, 0.05))


POLL_DUTY = 3      # a poll sleeps at least this many times as long as its check took
POLL_MAX_S = 0.5   # and never longer than this between checks


def paced(took: float, least: float) -> float:
    """Seconds to sleep between two checks of a wait: `least`, or more for a check that costs (an ssh call, a
    CLI process: 0.1-0.4 s of CPU each). Polled back to back, each waiting test kept most of a core busy and the
    integration suite was CPU-bound on 2 cores; paced, a check takes at most a quarter of the wait, and a state
    is seen at most POLL_MAX_S late."""
    return max(least, min(POLL_MAX_S, POLL_DUTY * took))


def pid_alive_on(target: Target, pid: int) -> bool:
    """Is `pid` a live (non-zombie) process on the target host? (ssh hosts have their own PID namespace)"""
    if target.ssh_host is None:
        return pid_alive(pid)
    done = target.ssh_host.ssh(["cat", f"/proc/{pid}/stat"])
    return done.returncode == 0 and done.stdout.rsplit(")", 1)[1].split()[0] != "Z"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def submit_refused(tmp_path: Path, spec: dict) -> str:
    """Submit SPEC (its host.root under tmp_path): exit 2, and the local "host" never called (it would have made
    ROOT/payload). Returns stderr, for the caller to look for the field's name."""
    root = Path(spec["host"]["root"])
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = run_cli(Target(kind="none", host=spec["host"], root=root, env={}), "submit", str(path))
    assert done.returncode == 2, done.stderr.decode()
    assert not root.exists()
    return done.stderr.decode()
