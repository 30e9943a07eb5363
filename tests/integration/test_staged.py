"""A staged payload (`payload.staged: true`): started before the service is touched, it does its GPU-free setup,
prints `{"event": "staged"}`, and gets the GPU when the supervisor writes `go` on its stdin. A payload that dies
or times out while staged ends the job with the service never stopped; the downtime does not count staging.

The demo payload on host `local` (cheap), then on the confined real systemd + sshd host.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli_helpers import (REPO, Target, job_dir, pid_alive, run_cli, status, submit, submit_refused, wait_for,
                               wait_terminal)
from tests.hosts._proc import shared_tmpdir

DEMO = REPO / "remote_payload" / "payloads" / "demo" / "demo_payload.py"


def staged_spec(host: dict, stage_timeout: str = "1m", service: dict | None = None, **args) -> dict:
    return {"name": "staged demo", "host": host, "service": service or {"manager": "none"},
            "payload": {"script": "demo_payload.py", "args": {"seconds": 1, "sizes": [1], **args}, "staged": True},
            "limits": {"max_runtime": "1m", "grace": "2s", "stage_timeout": stage_timeout}}


def write(work: Path, spec: dict) -> Path:
    path = work / "staged.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def local_events(target: Target, job_id: str) -> list[dict]:
    text = (job_dir(target, job_id) / "events.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def index_of(events: list[dict], **fields) -> int:
    return next(i for i, e in enumerate(events) if all(e.get(k) == v for k, v in fields.items()))


def test_the_payload_is_staged_before_it_runs_and_gets_go(target, work):
    job_id = submit(target, write(work, staged_spec(target.host, setup_seconds=0.5)))
    job = wait_terminal(target, job_id)
    assert job["state"] == "SUCCEEDED", job
    events = local_events(target, job_id)
    staged, running = index_of(events, event="stage", status="staged"), index_of(events, event="state", state="RUNNING")
    assert index_of(events, event="stage", status="start") < staged < index_of(events, event="stage", status="go") \
        < running, events
    log = (job_dir(target, job_id) / "output.log").read_text()
    assert log.index('"staged"') < log.index('"row"'), log
    assert job["stage"]["seconds"] >= 0.5


def test_max_runtime_counts_from_the_hand_over_not_from_the_staging(target, work):
    spec = staged_spec(target.host, setup_seconds=4)
    spec["limits"]["max_runtime"] = "3s"  # shorter than the setup, longer than the run after go
    job = wait_terminal(target, submit(target, write(work, spec)))
    assert job["state"] == "SUCCEEDED", job
    assert job["stage"]["seconds"] >= 4


def test_a_payload_that_exits_while_staged_fails_the_job_with_a_message(target, work):
    job = wait_terminal(target, submit(target, write(work, staged_spec(target.host, fail_setup=True))))
    assert job["state"] == "FAILED", job
    assert "while staged" in job["message"] and "the service was not touched" in job["message"], job
    assert job["exit_code"] == 3 and job["started_at"] is None


def test_a_payload_not_staged_within_stage_timeout_is_timed_out(target, work):
    job = wait_terminal(target, submit(target, write(work, staged_spec(target.host, "1s", setup_seconds=30))))
    assert job["state"] == "TIMED_OUT", job
    assert "limits.stage_timeout" in job["message"] and "the service was not touched" in job["message"], job


def test_a_cancel_while_staged_ends_the_job_before_the_service_is_touched(target, work):
    job_id = submit(target, write(work, staged_spec(target.host, setup_seconds=30)))
    wait_for(lambda: status(target, job_id)["phase"].startswith("staging"), what="staging")
    assert run_cli(target, "cancel", job_id).returncode == 0
    job = wait_terminal(target, job_id)
    assert job["state"] == "CANCELLED" and "the service was not touched" in job["message"], job


def test_a_supervisor_killed_while_staged_leaves_no_payload_behind(target, work):
    job_id = submit(target, write(work, staged_spec(target.host, setup_seconds=30)))
    wait_for(lambda: (status(target, job_id).get("payload") or {}).get("pid"), what="the staged payload")
    job = status(target, job_id)
    os.kill(job["supervisor"]["pid"], signal.SIGKILL)
    job = wait_terminal(target, job_id)
    assert job["state"] in ("FAILED", "LOST") and job["started_at"] is None, job
    wait_for(lambda: not pid_alive(job["payload"]["pid"]), what="the staged payload gone")


def test_staged_with_a_sweep_is_refused_naming_the_field(tmp_path):
    spec = staged_spec({"address": "local", "root": str(tmp_path / "root")})
    spec["sweep"] = {"matrix": {"sizes": [[1], [4]]}}
    assert "payload.staged" in submit_refused(tmp_path, spec)


def test_the_host_refuses_staged_with_a_sweep_and_a_non_boolean():
    from remote_payload.host.answer import Fail
    from remote_payload.supervision.spec import check_spec
    base = {"job_id": "j1", "payload": {"command": ["true"], "staged": True}}
    assert check_spec(base)["limits"]["stage_timeout"] == 600.0
    for bad, field in ((dict(base, sweep={"variants": [{"args": {}, "argv": ["true"]}]}), "payload.staged"),
                       ({"job_id": "j1", "payload": {"command": ["true"], "staged": "yes"}}, "payload.staged"),
                       (dict(base, limits={"stage_timeout": 0}), "limits.stage_timeout")):
        with pytest.raises(Fail) as caught:
            check_spec(bad)
        assert field in str(caught.value)


def run_demo_staged(stdin: bytes, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, RUNNER_STAGED="1", RUNNER_RESULT=str(shared_tmpdir("runner-demo-") / "r.json"))
    return subprocess.run([sys.executable, str(DEMO), "--seconds", "0.5", "--sizes", "1", *args], input=stdin,
                          capture_output=True, env=env, timeout=60)


def test_the_staged_demo_exits_without_running_when_stdin_closes_before_go():
    done = run_demo_staged(b"")
    lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert done.returncode != 0 and lines[-1]["event"] == "staged", done
    assert not any(e["event"] == "row" for e in lines)
    assert run_demo_staged(b"go\n").returncode == 0


# ── under the confined systemd host ──────────────────────────────────────────────────────────────────────

STAGED_PROBE = """
    import json, subprocess, sys, time
    unit = sys.argv[1]

    def saw(who):
        state = subprocess.run(["systemctl", "is-active", unit], capture_output=True, text=True).stdout.strip()
        print("%s-saw-%s" % (who, state), flush=True)

    saw("setup")
    time.sleep(2)  # the GPU-free setup
    saw("staged")
    print(json.dumps({"event": "staged"}), flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(4)
    saw("payload")
"""


@pytest.mark.systemd
def test_the_unit_is_stopped_only_after_the_staged_event_and_the_downtime_excludes_staging(service_host, work):
    from tests.cli_helpers import python_payload
    from tests.harness.systemd_jobs import assert_service_back, host_events, host_output, service_section, target_for
    target = target_for(service_host)
    spec = staged_spec(target.host, service=service_section(service_host, "always"))
    spec["payload"] = {"command": python_payload(work, "probe.py", STAGED_PROBE) + [service_host.unit], "staged": True}
    job_id = submit(target, write(work, spec))
    job = wait_terminal(target, job_id)
    assert_service_back(service_host, job, "staged payload: stop after the staged event", "SUCCEEDED")
    log = host_output(service_host, job_id)
    assert "setup-saw-active" in log and "staged-saw-active" in log and "payload-saw-inactive" in log, log
    events = host_events(service_host, job_id)
    began = events[index_of(events, event="stage", status="start")]["t"]
    staged = events[index_of(events, event="stage", status="staged")]["t"]
    assert index_of(events, event="stage", status="staged") < index_of(events, event="state", state="STOPPING_SERVICE")
    service = job["service"]
    assert service["stopped_at"] >= staged >= began + 2, (service, staged, began)
    not_serving = service["downtime"]["not_serving_s"]
    assert not_serving == pytest.approx(service["restored_at"] - service["stopped_at"], abs=0.01)
    assert not_serving <= service["restored_at"] - began - 2  # the 2 s of setup are not downtime


@pytest.mark.systemd
@pytest.mark.parametrize("args, stage_timeout, state", [({"fail_setup": True}, "1m", "FAILED"),
                                                        ({"setup_seconds": 30}, "1s", "TIMED_OUT")])
def test_a_payload_that_dies_or_times_out_while_staged_never_stops_the_unit(service_host, work, args, stage_timeout,
                                                                          state):
    from tests.harness.systemd_jobs import main_pid, service_section, target_for
    before = main_pid(service_host)
    target = target_for(service_host)
    spec = staged_spec(target.host, stage_timeout, service=service_section(service_host, "always"), **args)
    job = wait_terminal(target, submit(target, write(work, spec)))
    assert job["state"] == state and "the service was not touched" in job["message"], job
    assert job["service"]["stopped"] is False and main_pid(service_host) == before
    assert service_host.service_state() == "active" and service_host.health_status() == 200


def run_bench_staged(tmp_path: Path, stdin: bytes) -> tuple[subprocess.CompletedProcess, list[dict]]:
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, str(REPO / "remote_payload" / "payloads" / "marlin_moe" / "bench_marlin_moe.py"), "--experts", "8", "--hidden", "128",
         "--intermediate", "64", "--topk", "2", "--batch-sizes", "1,2", "--device", "cpu", "--iterations", "2",
         "--repeats", "1", "--out", str(tmp_path / "result.json")],
        input=stdin, capture_output=True, cwd=tmp_path, timeout=120, env=dict(os.environ, RUNNER_STAGED="1"))
    return done, [json.loads(line) for line in done.stdout.decode().splitlines()]


@pytest.mark.slow(seconds=30)
def test_the_staged_bench_loads_its_backend_before_the_staged_line_and_the_rest_after_go(tmp_path):
    done, events = run_bench_staged(tmp_path, b"go\n")
    assert done.returncode == 0, done.stderr
    staged = index_of(events, event="staged")
    assert index_of(events, event="phase", phase="import", status="end") < staged
    assert index_of(events, event="phase", phase="load", backend="torch", status="end") < staged
    assert staged < index_of(events, event="phase", phase="weights", status="start")
    loads = [e for e in events if e.get("phase") == "load" and e.get("status") == "start"]
    assert [e["backend"] for e in loads] == ["sglang", "sglang-kernels", "torch"]  # each tried once, while staged
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["backend"]["used"] == "torch" and "needs a CUDA device" in result["backend"]["why"]
    assert [r["m"] for r in result["rows"]] == [1, 2]


def test_the_staged_bench_exits_without_its_run_when_stdin_closes_before_go(tmp_path):
    done, events = run_bench_staged(tmp_path, b"")
    assert done.returncode != 0 and events[-1]["event"] == "staged", done
    assert not (tmp_path / "result.json").exists()


HOLD_AFTER_GO = """
    import json, subprocess, sys
    print(json.dumps({"event": "staged"}), flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(4)
    sys.exit(subprocess.call([sys.executable] + sys.argv[1:]))
"""


@pytest.mark.systemd
def test_a_staged_payload_with_free_sglang_is_staged_before_the_engine_is_paused(service_host, work):
    from tests.cli_helpers import python_payload
    from tests.harness.systemd_jobs import assert_service_back, calls, gpu_job, hold, host_events, main_pid, target_for
    log = service_host.install_engine_unit("sglang", "--memory-saver", "--weights-cpu-backup")
    pid = main_pid(service_host)
    target = target_for(service_host)
    path = gpu_job(work, service_host, need=30000, free="sglang",
                   command=python_payload(work, "staged_hold.py", HOLD_AFTER_GO) + hold(30000)[1:])
    spec = yaml.safe_load(path.read_text())
    spec["payload"]["staged"] = True
    job_id = submit(target, write(work, spec))
    job = wait_terminal(target, job_id)
    assert_service_back(service_host, job, "staged payload, free: sglang", "SUCCEEDED")
    assert main_pid(service_host) == pid
    assert 'POST /pause_generation {"mode": "in_place"}' in calls(log)  # the default drain's pause
    paused = next(json.loads(line)["t"] for line in log.read_text().splitlines()
                  if json.loads(line)["path"] == "/pause_generation")
    events = host_events(service_host, job_id)
    staged = events[index_of(events, event="stage", status="staged")]["t"]
    assert staged <= paused and staged <= job["service"]["stopped_at"]  # "not serving" starts after staging
