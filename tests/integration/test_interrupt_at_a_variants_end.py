"""A cancel or a SIGTERM while a variant's left-over child is cleaned up, a plain job being a sweep of one
(remote_payload/supervision/variants.py): after the last payload exited 0 it has nothing left to stop and the job
stays SUCCEEDED; with variants still to run it is the job's ending from the moment it is seen.

The local host (no service stopped; the window, when there is one, counts from the payload's start).
"""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import yaml

from tests.cli_helpers import Target, job_dir, pid_alive, python_payload, run_cli, submit, wait_for, \
    wait_terminal, write_job

PAYLOAD = """\
import json, os, signal, subprocess, sys, time
mode = sys.argv[1]
if mode == "leave-child":  # exits 0 at once, a child left in its group that ignores TERM (it is KILLed)
    subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "print('child up', flush=True); time.sleep(120)"])
    time.sleep(0.5)
with open(os.environ["RUNNER_RESULT"], "w") as fh:
    json.dump({"rows": [{"mode": mode}]}, fh)
print("payload exiting", flush=True)
"""


def job_file(work: Path, target: Target, mode: str, *, sweep: list | None = None, grace: str = "2s",
             max_runtime: str = "1m") -> Path:
    """The payload as a command: plain (`mode`), or a sweep over `{m}`."""
    command = python_payload(work, "payload.py", PAYLOAD) + (["{m}"] if sweep is not None else [mode])
    path = write_job(work / "job.yaml", target, command=command, grace=grace, max_runtime=max_runtime)
    if sweep is not None:
        spec = yaml.safe_load(path.read_text())
        spec["sweep"] = {"include": sweep}
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def read_status(target: Target, job_id: str) -> dict:
    return json.loads((job_dir(target, job_id) / "status.json").read_text())


def cancel(target: Target, job_id: str) -> None:
    assert run_cli(target, "cancel", job_id).returncode == 0


def sigterm_supervisor(target: Target, job_id: str) -> None:
    os.kill(read_status(target, job_id)["supervisor"]["pid"], signal.SIGTERM)


@pytest.mark.parametrize("sweep", [None, [{"m": "leave-child"}], [{"m": "quick"}, {"m": "leave-child"}]],
                         ids=["plain", "sweep-of-one", "sweep-last"])
@pytest.mark.parametrize("interrupt", [cancel, sigterm_supervisor], ids=["cancel", "sigterm"])
def test_an_interrupt_after_the_last_payload_exited_0_does_not_undo_its_success(work, target, sweep, interrupt):
    """The payload exited 0 and wrote its result; the supervisor is still stopping a child it left in its
    group (TERM ignored: KILL after the grace). A cancel or a SIGTERM to the supervisor in that grace has
    nothing left to stop: the job stays SUCCEEDED (not CANCELLED, nor FAILED "the supervisor got SIGTERM; the
    payload was stopped" with exit_code 0 and every variant succeeded)."""
    job_id = submit(target, job_file(work, target, "leave-child", sweep=sweep, grace="15s"))
    log = job_dir(target, job_id) / "output.log"
    wait_for(lambda: log.exists() and log.read_bytes().count(b"payload exiting") == len(sweep or [1]), timeout=60,
             what="the last payload exiting")
    wait_for(lambda: not pid_alive(read_status(target, job_id)["payload"]["pid"]), timeout=30,
             what="the payload's process gone")
    interrupt(target, job_id)
    job = wait_terminal(target, job_id, timeout=90)
    assert job["state"] == "SUCCEEDED", job
    assert job["exit_code"] == 0 and not job.get("ending"), job


@pytest.mark.slow(seconds=45)
def test_a_cancel_while_a_variant_is_cleaned_up_with_more_to_run_is_recorded_at_once(work, target):
    """Variant 1 exited 0 and its left-over child has a long grace; variant 2 is still to run. The cancel
    stops the sweep (variant 2 skipped) and is the job's ending from the moment it is seen, not after the
    grace: a restorer taking over meanwhile must find TERMINATING with `ending`."""
    sweep = [{"m": "leave-child"}, {"m": "quick"}]
    job_id = submit(target, job_file(work, target, "", sweep=sweep, grace="40s"))
    log = job_dir(target, job_id) / "output.log"
    wait_for(lambda: log.exists() and b"payload exiting" in log.read_bytes(), timeout=60, what="variant 1 exiting")
    wait_for(lambda: not pid_alive(read_status(target, job_id)["payload"]["pid"]), timeout=30,
             what="variant 1's process gone")
    cancel(target, job_id)
    wait_for(lambda: (read_status(target, job_id).get("ending") or {}).get("state") == "CANCELLED", timeout=20,
             what="the ending recorded while the grace (40 s) runs")
    job = wait_terminal(target, job_id, timeout=120)
    assert job["state"] == "CANCELLED", job
    result = json.loads(run_cli(target, "results", job_id, "--json").stdout)
    assert [v["status"] for v in result["variants"]] == ["ended", "skipped"], result
    assert result["variants"][0]["exit_code"] == 0, result
