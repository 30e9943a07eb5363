"""The service window of a job that freed several services (`services:` with `gpus:`): each freed service's
users are down for that service's own window, so `runner results` shows one window per freed service and the
job's window (the history's `not_serving_s`, MCP `results`' `service_window`) is the longest of them. A job
that freed one service keeps its window as it was; a service left serving, or picked but not stopped, is in
none of it."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from remote_payload.supervision.files import JobPaths, write_json_atomic
from remote_payload.verbs.result import service_windows
from runner.results import gate
from runner.results.window import window_of
from tests.cli_helpers import run_cli, submit, wait_terminal
from tests.harness.systemd_jobs import target_for
from tests.harness.multi_services import SECOND, multi_job, two_services
from tests.hosts._proc import shared_tmpdir

WRITES_A_RESULT = ["sh", "-c", "printf '{\"rows\": [{\"size\": 1, \"median_us\": 5.0}]}' > \"$RUNNER_RESULT\""]


def record(unit: str, not_serving: float | None, **parts) -> dict:
    """One service's status record as the host writes it once the service is back (settle.restore), shaped
    like a real run's (tests/integration/test_multi_gpu_services.py's two units on a confined systemd)."""
    downtime = {"drain_s": 0.024, "health_s": 2.119, "method": "stop", "not_serving_s": not_serving,
                "payload_s": 0.966, "release_s": 1.012, "resume_s": 0.029, **parts}
    stopped_at = 1796165764.266
    return {"downtime": downtime, "downtime_s": not_serving or 9.0, "freed_at": stopped_at + 1.012,
            "gpus": ["0", "1"], "health_timeout": 30.0, "health_url": "http://127.0.0.1:39511/health",
            "healthy": not_serving is not None, "manager": "systemd", "now": "active",
            "restored_at": stopped_at + (not_serving or 9.0),
            "resumed": {"health_s": 2.119, "how": "start", "resume_s": 0.029}, "scope": "system", "stop": "always",
            "stopped": True, "stopped_at": stopped_at, "sudo": False, "unit": unit, "was": "active"}


def kept(unit: str) -> dict:
    """A picked service this job did not stop (`stop: if-needed` and enough memory): observed, never stopped."""
    return {"manager": "systemd", "unit": unit, "was": "active", "now": "active", "stopped": False, "healthy": True}


def status(*services: dict) -> dict:
    """status.json of a finished job: `service` is the first record; with several, `services` holds them all."""
    job = {"job_id": "j-1", "state": "SUCCEEDED", "service": services[0] if services else {"manager": "none"}}
    if len(services) > 1:
        job["services"] = list(services)
    return job


def job_window(tmp_path: Path, job: object) -> dict | None:
    """The job's window as `runner results` makes it from status.json: the host's `result` answer lists each
    freed service's window (remote_payload/verbs/result.py), the controller combines them (window_of)."""
    paths = JobPaths(str(tmp_path), "j-1")
    os.makedirs(paths.dir, exist_ok=True)
    write_json_atomic(paths.status, job)
    return window_of([(w["unit"], w["window"]) for w in service_windows(paths)])


# -- the window of a status -------------------------------------------------------------------------------

def test_one_freed_service_keeps_its_window_as_it_was(tmp_path):
    one = record("a.service", 3.2)
    assert job_window(tmp_path, status(one)) == one["downtime"]


def test_a_job_that_freed_nothing_has_no_window(tmp_path):
    assert job_window(tmp_path, status()) is None
    assert job_window(tmp_path, status(kept("a.service"), kept("b.service"))) is None
    assert job_window(tmp_path, {"job_id": "j-1", "state": "FAILED"}) is None


def test_two_freed_services_each_have_their_window_and_the_job_the_longest(tmp_path):
    """The numbers of a real run on GPUs 1 and 2: the second unit was stopped later and came back sooner."""
    a = record("dummy-infer.service", 4.162)
    b = record("second-infer.service", 3.104, health_s=0.011, payload_s=2.327, release_s=0.721, resume_s=0.012)
    window = job_window(tmp_path, status(a, b))
    assert window["units"] == ["dummy-infer.service", "second-infer.service"]
    assert window["services"] == [{"unit": "dummy-infer.service", **a["downtime"]},
                                  {"unit": "second-infer.service", **b["downtime"]}]
    assert {k: window[k] for k in ("method", "not_serving_s", "release_s", "drain_s", "payload_s", "resume_s",
                                   "health_s")} == {"method": "stop", "not_serving_s": 4.162, "release_s": 1.012,
                                                    "drain_s": 0.024, "payload_s": 2.327, "resume_s": 0.029,
                                                    "health_s": 2.119}


def test_the_history_records_the_longest_outage(tmp_path):
    window = job_window(tmp_path, status(record("a.service", 3.2), record("b.service", 5.5, health_s=4.0)))
    metrics = gate.window_metrics(window)
    assert set(metrics) == {"not_serving_s", "release_s", "drain_s", "payload_s", "resume_s", "health_s"}
    assert metrics["not_serving_s"] == gate.Metric(5.5, "lower") and metrics["health_s"].value == 4.0


def test_a_service_not_stopped_is_not_in_the_window(tmp_path):
    """The first picked service kept serving, the second was freed: the window is the second's, as one."""
    b = record("b.service", 5.5)
    assert job_window(tmp_path, status(kept("a.service"), b)) == b["downtime"]
    a, c = record("a.service", 3.2), record("c.service", 1.0)
    assert job_window(tmp_path, status(a, kept("b.service"), c))["units"] == ["a.service", "c.service"]


def test_a_service_not_healthy_again_leaves_the_longest_outage_unknown(tmp_path):
    """`not_serving_s` is None for a service that did not come back: the job's longest outage is not the
    other one's, so it is unknown too (and left out of the history, as for one service)."""
    window = job_window(tmp_path, status(record("a.service", 3.2), record("b.service", None)))
    assert window["not_serving_s"] is None and window["payload_s"] == 0.966
    assert "not_serving_s" not in gate.window_metrics(window)
    assert window["services"][1]["not_serving_s"] is None


def test_different_methods_are_named_together(tmp_path):
    a, b = record("a.service", 3.2), record("b.service", 2.0, method="sglang")
    assert job_window(tmp_path, status(a, b))["method"] == "stop+sglang"


def test_a_malformed_record_is_skipped_not_raised(tmp_path):
    """status.json is the payload's to overwrite: a record or a downtime of the wrong shape is no window."""
    a = record("a.service", 3.2)
    assert job_window(tmp_path, {"state": "SUCCEEDED", "service": a,
                                 "services": ["x", {"unit": "b.service", "downtime": "x"}, a]}) == a["downtime"]
    assert job_window(tmp_path, {"state": "SUCCEEDED", "service": "x", "services": "x"}) is None
    assert job_window(tmp_path, "x") is None


# -- on a real host: runner results, the history, MCP results -------------------------------------------

def windows_shown(stderr: bytes) -> list[str]:
    return [line for line in stderr.decode().splitlines() if line.startswith("service window")]


@pytest.mark.systemd
def test_results_of_a_job_that_freed_two_services_show_both(service_host, runner_state_dir):
    target, work = target_for(service_host), shared_tmpdir("runner-winsvc-")
    job_file = multi_job(work / "job.yaml", service_host, two_services(service_host), [1, 2], command=WRITES_A_RESULT)
    job = wait_terminal(target, submit(target, job_file))
    assert job["state"] == "SUCCEEDED", job
    units = [r["unit"] for r in job["services"]]
    assert units == [service_host.unit, SECOND] and all(r["stopped"] for r in job["services"]), job
    shown = run_cli(target, "results", job["job_id"])
    assert shown.returncode == 0, shown.stderr
    lines = windows_shown(shown.stderr)
    assert len(lines) == 2, shown.stderr
    for line, unit in zip(lines, units):
        assert line.startswith(f"service window of {unit} (stop): not serving ") and "health" in line, line
    longest = max(r["downtime"]["not_serving_s"] for r in job["services"])
    history = run_cli(target, "history", "--json", "--metric", "not_serving_s")
    assert history.returncode == 0, history.stderr
    metrics = {r["job_id"]: r for r in json.loads(history.stdout)}[job["job_id"]]["metrics"]
    assert metrics["not_serving_s"]["value"] == pytest.approx(longest)
    window = mcp_results_window(runner_state_dir, target, job["job_id"])
    assert window["units"] == units and window["not_serving_s"] == pytest.approx(longest)
    assert [w["unit"] for w in window["services"]] == units


def mcp_results_window(state: Path, target, job_id: str) -> dict:
    """MCP `results`' `service_window` for the job, from a real `runner mcp` over stdio."""
    pytest.importorskip("mcp")
    import anyio

    from tests.harness.mcp_stdio import mcp_session

    async def go():
        async with mcp_session(state, env=target.env) as client:
            answer = await client.call_tool("results", {"job_id": job_id})
            assert not answer.is_error, answer.content[0].text
            return answer.structured_content["service_window"]
    return anyio.run(go)
