"""Jobs on the confined systemd + sshd test host (tests/hosts/systemd_host.py): the target that reaches it, a
GPU job that may stop its unit, the restore invariant, and the host's own records read over plain ssh."""
from __future__ import annotations

import json
import time
from pathlib import Path

from tests.case_report import record
from tests.cli_helpers import Target, wait_for, write_job

HOLD = str(Path(__file__).parent.parent / "hosts" / "hold_gpu.py")
SMALL_GPU = 20000  # MiB; the unit holds 4096 of it while active


# The start of a hostile payload (Python, run by python3 on the host): `path` is its status.json, and it waits up to
# 30 s until the supervisor has recorded it running with its guard's and its own pid (what it then forges, or
# kills, is there), then loads `status`.
RECORDED_PRELUDE = """
import json, os, signal, sys, time
path = os.path.join(os.environ["RUNNER_JOB_DIR"], "status.json")
def recorded():
    status = json.load(open(path))
    return (status.get("payload") or {}).get("pid") == os.getpid() and all(
        (status.get(who) or {}).get("pid") for who in ("guard", "supervisor"))
deadline = time.time() + 30
while not recorded() and time.time() < deadline:
    time.sleep(0.05)
status = json.load(open(path))
"""


def target_for(host, alias: str | None = None) -> Target:
    return Target("ssh", {"address": alias or host.alias}, Path("/root/.runner"),
                  {"RUNNER_SSH_CONFIG": str(host.ssh_config)}, host)


def service_section(host, stop: str = "if-needed", **extra) -> dict:
    return {"manager": "systemd", "unit": host.unit, "stop": stop, "health_url": host.health_url,
            "health_timeout": "30s", **extra}


def gpu_job(work: Path, host, *, stop="if-needed", need=8000, command=None, max_runtime="2m", grace="2s",
            drain="20s", target=None, **service_extra) -> Path:
    target = target or target_for(host)
    command = command or ["python3", HOLD, str(need - 1000), "1"]
    return write_job(work / "job.yaml", target, command=command, max_runtime=max_runtime, grace=grace,
                     service=service_section(host, stop, **service_extra),
                     gpu={"devices": [0], "min_free_mib": need, "drain_timeout": drain})


def main_pid(host) -> str:
    return host.systemctl("show", "-P", "MainPID", host.unit).stdout.strip()


def assert_service_back(host, job: dict, case: str, expected: str) -> None:
    """The invariant: the service is as it was (active) and healthy, and status.json says so."""
    now, health = host.service_state(), host.health_status()
    record(case, job, expected=expected, service_now=now, healthy=(now == "active" and health == 200))
    assert job["state"] == expected, job
    assert now == "active" and health == 200, f"service {now}, health {health}"
    assert job["service"]["was"] == "active" and job["service"]["now"] == "active", job["service"]
    assert job["service"]["healthy"] is True


HANG = ["python3", "-c", "import time; print('hanging', flush=True); time.sleep(600)"]


def host_status(host, job_id: str) -> dict:
    done = host.ssh(["cat", f"/root/.runner/jobs/{job_id}/status.json"])
    return json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else {}


def host_events(host, job_id: str) -> list[dict]:
    done = host.ssh(["cat", f"/root/.runner/jobs/{job_id}/events.jsonl"])
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def host_output(host, job_id: str) -> str:
    return host.ssh(["cat", f"/root/.runner/jobs/{job_id}/output.log"]).stdout


def restored_within(host, job_id: str, timeout: float) -> float:
    """Seconds until status.json says restored, read over ssh only."""
    t0 = time.monotonic()
    wait_for(lambda: host_status(host, job_id).get("restored") is True, timeout=timeout, what="restored")
    return time.monotonic() - t0


def calls(path) -> list[str]:
    """The stand-in's requests, without the health polls of systemctl's side (tests and wait_healthy)."""
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [f"{c['method']} {c['path']}" + (f" {c['body']}" if c["body"] else "") for c in lines
            if c["path"] not in ("/health", "/standin_state")]


def standin_state(host) -> dict:
    """The engine stand-in's GET /standin_state (its memory, pause and clients' requests), asked on the host."""
    url = host.health_url.rsplit("/", 1)[0] + "/standin_state"
    probe = "import sys, urllib.request\nprint(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"
    return json.loads(host.ssh(["python3", "-c", probe, url], check=True).stdout)


def hold(need: int) -> list[str]:
    return ["python3", HOLD, str(need - 1000), "1"]


def starts_and_stops(host) -> tuple[int, int]:
    """The dummy unit's starts and SIGTERMs so far, from its own log."""
    log = host.service_log.read_text() if host.service_log.exists() else ""
    return log.count(" serving on "), log.count("SIGTERM")


def outcome(load: dict) -> dict:
    """The engine stand-in's clients in short: running and held now, completed and aborted so far."""
    return {key: load[key] for key in ("running", "held", "completed", "aborted")}
