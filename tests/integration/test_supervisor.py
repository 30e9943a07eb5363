"""remote_payload/supervisor.py as the controller sees it: real subprocesses, real detached jobs, no SSH.

GPU memory comes from the nvidia-smi test stand-in (tests/hosts/bin/nvidia-smi, a fake: this machine has no
GPU); its state dir is per test. The systemd paths are exercised by the systemd test host elsewhere.
"""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.harness.supervisor_calls import Host, SUPERVISOR, alive, gpu_spec, pid_gone

HOSTILE = "name with spaces 'single' \"double\" ; $(touch /tmp/pwned) `id` \\ back\nnewline"


@pytest.fixture
def host(tmp_path):
    h = Host(tmp_path)
    yield h
    h.cleanup()


def read_log(host: Host, job_id: str, max_bytes: int) -> bytes:
    out, offset = b"", 0
    while True:
        answer = host.ok("logs", "--job-id", job_id, "--offset", str(offset), "--max", str(max_bytes), "--wait", "2")
        chunk = base64.b64decode(answer["data_b64"])
        assert answer["offset"] == offset and answer["next_offset"] == offset + len(chunk)
        out, offset = out + chunk, answer["next_offset"]
        if answer["terminal"] and offset == answer["size"]:
            return out


# ── start / status ───────────────────────────────────────────────────────────────────────────────────

def test_start_returns_at_once_while_the_payload_keeps_running(host):
    t0 = time.monotonic()
    answer = host.start("j1", host.spec("sleep", "30", "0"))
    # capture_output waits for every holder of stdout: a fast return proves the supervisor let go of it
    assert time.monotonic() - t0 < 5
    assert answer["job_id"] == "j1" and answer["job_dir"] == str(host.root / "jobs" / "j1")
    status = host.wait("j1", "RUNNING")
    assert status["supervisor_pid"] == answer["supervisor_pid"] and alive(status["supervisor"])
    assert alive(status["guard"]) and alive(status["payload"])
    assert status["payload"]["pgid"] == status["payload"]["pid"] != status["supervisor"]["pid"]


def test_a_job_id_is_used_once(host):
    host.start("j1", host.spec("sleep", "0", "0"))
    rc, answer = host.call("start", "--job-id", "j1", spec=host.spec("sleep", "0", "0"))
    assert rc == 1 and answer["error"] == "exists"


def test_concurrent_starts_of_one_id_claim_it_once(host):
    spec = json.dumps(host.spec("sleep", "0", "0")).encode()
    argv = [sys.executable, str(SUPERVISOR), "start", "--job-id", "same", "--root", str(host.root)]
    procs = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=host.env) for _ in range(4)]
    answers = [json.loads(p.communicate(spec, timeout=60)[0]) for p in procs]
    assert sorted(a.get("error", "ok") for a in answers) == ["exists", "exists", "exists", "ok"]
    assert [j["job_id"] for j in host.ok("status")["jobs"]] == ["same"]


def test_exit_codes_and_success(host):
    host.start("ok", host.spec("sleep", "0", "0"))
    host.start("bad", host.spec("sleep", "0", "3"))
    ok = host.wait("ok", "SUCCEEDED")
    bad = host.wait("bad", "FAILED")
    assert ok["exit_code"] == 0 and ok["restored"] is True and ok["ended_at"] >= ok["started_at"]
    assert bad["exit_code"] == 3 and bad["payload"]["signal"] is None and "code 3" in bad["message"]
    events = [json.loads(line) for line in (host.root / "jobs" / "ok" / "events.jsonl").read_text().splitlines()]
    assert [e["state"] for e in events if e["event"] == "state"] == ["RUNNING", "RESTORING", "SUCCEEDED"]


def test_unknown_job_and_argument_errors(host):
    assert host.ok("status", "--job-id", "nope")["jobs"] == [{"job_id": "nope", "state": "UNKNOWN"}]
    assert host.call("status", "--job-id", "../etc")[1]["error"] == "bad-args"
    assert host.call("start", "--job-id", "..", spec=host.spec("sleep", "0", "0"))[1]["error"] == "bad-args"
    assert host.call("logs", "--job-id", "x")[1]["error"] == "bad-args"  # --offset missing
    assert host.call("frobnicate")[1]["error"] == "bad-args"
    assert host.call("logs", "--job-id", "nope", "--offset", "0")[1]["error"] == "unknown-job"
    rc, answer = host.call("start", "--job-id", "j", spec={"payload": {"command": ["x"], "env": {"A;B": "1"}}})
    assert rc == 1 and answer["error"] == "bad-spec" and not (host.root / "jobs" / "j").exists()
    assert host.call("start", "--job-id", "j2", spec="not an object")[1]["error"] == "bad-spec"


def test_corrupt_status_is_an_error_never_running(host):
    host.start("j1", host.spec("sleep", "0", "0"))
    host.wait("j1", "SUCCEEDED")
    (host.root / "jobs" / "j1" / "status.json").write_text('{"schema": 1, "state": "RUNN')
    for call in (("status", "--job-id", "j1"), ("logs", "--job-id", "j1", "--offset", "0")):
        rc, answer = host.call(*call)
        assert rc == 1 and answer["error"] == "bad-status", answer


def test_result_and_no_result(host):
    host.start("r", host.spec("report", "a"))
    host.wait("r", "SUCCEEDED")
    assert host.ok("result", "--job-id", "r")["result"]["argv"] == ["a"]
    host.start("n", host.spec("sleep", "0", "0"))
    host.wait("n", "SUCCEEDED")
    assert host.call("result", "--job-id", "n")[1]["error"] == "no-result"


def test_hostile_names_args_and_env_round_trip(host):
    spec = host.spec("report", HOSTILE, "--flag=" + HOSTILE, name=HOSTILE)
    spec["payload"]["env"] = {"HOSTILE": HOSTILE, "HOSTILE_EMPTY": ""}
    host.start("h", spec)
    status = host.wait("h", "SUCCEEDED")
    assert status["name"] == HOSTILE
    seen = host.ok("result", "--job-id", "h")["result"]
    assert seen["argv"] == [HOSTILE, "--flag=" + HOSTILE]
    assert seen["env"]["HOSTILE"] == HOSTILE and seen["env"]["HOSTILE_EMPTY"] == ""
    job_dir = str(host.root / "jobs" / "h")
    assert seen["cwd"] == job_dir and seen["env"]["RUNNER_JOB_DIR"] == job_dir
    assert seen["env"]["RUNNER_JOB_ID"] == "h" and seen["env"]["RUNNER_RESULT"] == job_dir + "/result.json"
    assert seen["env"]["PYTHONUNBUFFERED"] == "1" and "CUDA_VISIBLE_DEVICES" not in seen["env"]
    assert not Path("/tmp/pwned").exists()


# ── logs ─────────────────────────────────────────────────────────────────────────────────────────────

def test_logs_deliver_every_byte_exactly_once(host):
    blob = b"".join(b"line %d \xff\xfe\x00 caf\xc3\xa9\n" % i for i in range(40)) + b"partial last line \x80"
    (host.tmp / "blob").write_bytes(blob)
    host.start("l", host.spec("chunks", str(host.tmp / "blob")))
    assert read_log(host, "l", 29) == blob
    assert read_log(host, "l", 1 << 20) == blob


def test_logs_offset_past_the_end_is_an_error(host):
    host.start("l", host.spec("sleep", "0", "0"))
    host.wait("l", "SUCCEEDED")
    rc, answer = host.call("logs", "--job-id", "l", "--offset", "10000")
    assert rc == 1 and answer["error"] == "bad-offset"


def test_logs_wait_is_bounded(host):
    host.start("w", host.spec("sleep", "30", "0"))
    host.wait("w", "RUNNING")
    size = host.ok("logs", "--job-id", "w", "--offset", "0", "--wait", "5")["next_offset"]
    assert size == len(b"started\n")
    t0 = time.monotonic()
    answer = host.ok("logs", "--job-id", "w", "--offset", str(size), "--wait", "1")
    waited = time.monotonic() - t0
    assert 0.9 <= waited < 10 and answer["data_b64"] == "" and answer["terminal"] is False
    assert answer["state"] == "RUNNING" and answer["exit_code"] is None
    host.ok("cancel", "--job-id", "w")
    t0 = time.monotonic()
    answer = host.ok("logs", "--job-id", "w", "--offset", str(size), "--wait", "40")  # returns at terminal
    assert time.monotonic() - t0 < 30 and answer["terminal"] and answer["state"] == "CANCELLED"


# ── cancel / deadline / signals ──────────────────────────────────────────────────────────────────────

def test_cancel_kills_the_whole_group_even_what_ignores_sigterm(host):
    host.start("c", host.spec("stubborn", grace=0.5))
    child, payload = host.mark("child"), host.mark("payload")
    answer = host.ok("cancel", "--job-id", "c")
    assert answer["already"] is False
    status = host.wait("c", "CANCELLED")
    assert pid_gone(child) and pid_gone(payload)
    assert status["payload"]["signal"] == "SIGKILL" and status["exit_code"] == 128 + 9
    assert status["restored"] is True and "cancel" in status["message"]
    assert host.ok("cancel", "--job-id", "c")["already"] is True


def test_max_runtime_times_out_with_the_signal_recorded(host):
    host.start("t", host.spec("sleep", "60", "0", max_runtime=0.5))
    status = host.wait("t", "TIMED_OUT")
    assert status["payload"]["signal"] == "SIGTERM" and status["exit_code"] == 128 + 15
    assert "max_runtime" in status["message"] and not alive(status["payload"])


def test_max_runtime_escalates_to_kill(host):
    host.start("t", host.spec("stubborn", max_runtime=0.5, grace=0.3))
    child = host.mark("child")
    status = host.wait("t", "TIMED_OUT")
    assert status["payload"]["signal"] == "SIGKILL" and pid_gone(child)


def test_sigterm_to_the_supervisor_stops_in_order(host):
    answer = host.start("s", host.spec("stubborn", grace=0.3))
    child = host.mark("child")
    os.kill(answer["supervisor_pid"], signal.SIGTERM)
    status = host.wait("s", "FAILED")
    assert "SIGTERM" in status["message"] and status["restored"] is True
    assert pid_gone(child) and not alive(status["payload"])


def test_sigkill_to_the_supervisor_leaves_the_guard_to_finish(host):
    answer = host.start("k", host.spec("stubborn", grace=0.3))
    child = host.mark("child")
    host.wait("k", "RUNNING")
    os.kill(answer["supervisor_pid"], signal.SIGKILL)
    status = host.wait("k", "FAILED")
    assert "guard restored the service" in status["message"] and status["restored"] is True
    assert pid_gone(child) and not alive(status["payload"])
    assert pid_gone(status["guard"]["pid"])


def test_a_job_whose_supervisor_and_guard_died_is_lost_and_restored(host):
    answer = host.start("x", host.spec("stubborn", grace=0.3))
    child = host.mark("child")
    status = host.wait("x", "RUNNING")
    os.kill(status["guard"]["pid"], signal.SIGKILL)
    os.kill(answer["supervisor_pid"], signal.SIGKILL)
    assert pid_gone(status["guard"]["pid"]) and pid_gone(answer["supervisor_pid"])
    assert host.status("x")["state"] == "LOST"
    deadline = time.monotonic() + 20
    while not host.status("x")["restored"]:  # the detached restore kills the orphaned payload group
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert pid_gone(child) and host.status("x")["state"] == "LOST"
    assert host.ok("restore", "--job-id", "x")["already"] is True


def test_restore_is_idempotent_and_leaves_a_live_job_alone(host):
    host.start("r", host.spec("sleep", "30", "0"))
    host.wait("r", "RUNNING")
    assert host.ok("restore", "--job-id", "r")["deferred"] is True
    assert host.status("r")["state"] == "RUNNING"
    host.ok("cancel", "--job-id", "r")
    host.wait("r", "CANCELLED")
    for _ in range(2):
        answer = host.ok("restore", "--job-id", "r")
        assert answer["already"] is True and answer["state"] == "CANCELLED"


# ── locks ────────────────────────────────────────────────────────────────────────────────────────────

def test_a_busy_gpu_refuses_a_second_job_naming_the_holder(host):
    first = host.start("a", gpu_spec(host, "sleep", "30", "0"))
    host.wait("a", "RUNNING")
    rc, answer = host.call("start", "--job-id", "b", spec=gpu_spec(host, "sleep", "0", "0"))
    assert rc == 1 and answer["error"] == "busy"
    assert answer["holder"]["job_id"] == "a" and answer["holder"]["pid"] == first["supervisor_pid"]
    assert answer["holder"]["key"] == "gpu-0" and "job a" in answer["message"]
    assert host.status("b")["state"] == "UNKNOWN"  # refused: the id stays free for a retry
    locks = host.ok("preflight", spec=gpu_spec(host, "sleep", "0", "0"))["locks"]
    assert locks == [{"key": "gpu-0", "held": True, "holder": dict(answer["holder"])}]


def test_the_guard_keeps_the_locks_until_it_has_finished(host):
    answer = host.start("a", gpu_spec(host, "stubborn", grace=0.3))
    status = host.wait("a", "RUNNING")
    os.kill(status["guard"]["pid"], signal.SIGSTOP)  # hold the guard still while the supervisor dies
    try:
        os.kill(answer["supervisor_pid"], signal.SIGKILL)
        assert pid_gone(answer["supervisor_pid"])
        locks = host.ok("preflight", spec=gpu_spec(host, "sleep", "0", "0"))["locks"]
        assert locks[0]["held"] is True and locks[0]["holder"]["job_id"] == "a"
    finally:
        os.kill(status["guard"]["pid"], signal.SIGCONT)
    host.wait("a", "FAILED")
    assert pid_gone(status["guard"]["pid"])
    assert host.ok("preflight", spec=gpu_spec(host, "sleep", "0", "0"))["locks"][0]["held"] is False


def test_cpu_jobs_take_no_lock_and_run_side_by_side(host):
    host.start("a", host.spec("sleep", "30", "0"))
    host.start("b", host.spec("sleep", "30", "0"))
    host.wait("a", "RUNNING")
    host.wait("b", "RUNNING")


def test_queue_waits_for_the_lock_then_runs(host):
    # a holds the lock until the test ends it (a timed holder raced a loaded machine: b arrived after it)
    host.start("a", gpu_spec(host, "sleep", "60", "0"))
    host.wait("a", "RUNNING")
    answer = host.start("b", gpu_spec(host, "sleep", "0", "0"), "--queue")
    assert answer["state"] == "QUEUED" and answer["queued"] is True
    assert host.status("b")["state"] == "QUEUED"
    host.ok("cancel", "--job-id", "a")
    host.wait("a", "CANCELLED")
    status = host.wait("b", "SUCCEEDED")
    assert status["started_at"] >= host.status("a")["ended_at"]


def test_a_queued_job_gives_up_after_its_queue_timeout(host):
    """--queue is bounded: limits.queue_timeout ends the wait (TIMED_OUT, nothing started, the holder untouched)."""
    host.start("a", gpu_spec(host, "sleep", "30", "0"))
    host.wait("a", "RUNNING")
    spec = gpu_spec(host, "sleep", "0", "0")
    spec["limits"]["queue_timeout"] = 1.0
    host.start("b", spec, "--queue")
    status = host.wait("b", "TIMED_OUT", timeout=20)
    assert status["payload"] is None and status["started_at"] is None
    assert "queue_timeout" in status["message"] and "job a" in status["message"], status["message"]
    assert host.status("a")["state"] == "RUNNING"


def test_a_queued_job_can_be_cancelled(host):
    host.start("a", gpu_spec(host, "sleep", "30", "0"))
    host.wait("a", "RUNNING")
    host.start("b", gpu_spec(host, "sleep", "0", "0"), "--queue")
    host.ok("cancel", "--job-id", "b")
    status = host.wait("b", "CANCELLED")
    assert status["payload"] is None and host.status("a")["state"] == "RUNNING"


# ── GPU drain ────────────────────────────────────────────────────────────────────────────────────────

def hold_gpu(host: Host, mib: int, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(host.payload), "hold-gpu", str(mib), str(seconds)], env=host.env)
    deadline = time.monotonic() + 10
    while not (host.gpu_dir / "apps" / str(proc.pid)).exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return proc


def test_drain_waits_for_memory_then_runs(host):
    # the holder lets go only once d is seen draining (a timed holder raced a loaded machine: gone before d began)
    holder = hold_gpu(host, 140000, 60)
    try:
        host.start("d", gpu_spec(host, "report", required=9100, drain=20))
        host.wait("d", "DRAINING")
        time.sleep(0.6)  # the drain must last: the holder lets go only after it (drained_after_s > 0.5)
        holder.kill()
        holder.wait()
        status = host.wait("d", "SUCCEEDED")
    finally:
        holder.kill()
        holder.wait()
    assert status["gpu"]["drained_after_s"] > 0.5
    env = host.ok("result", "--job-id", "d")["result"]["env"]
    assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"]) == ("0", "PCI_BUS_ID")
    events = (host.root / "jobs" / "d" / "events.jsonl").read_text()
    assert '"DRAINING"' in events


def test_drain_timeout_names_the_pid_holding_memory(host):
    holder = hold_gpu(host, 140000, 60)
    try:
        host.start("d", gpu_spec(host, "report", required=9100, drain=1))
        status = host.wait("d", "FAILED")
    finally:
        holder.kill()
        holder.wait()
    assert f"pid {holder.pid} (140000 MiB)" in status["message"] and "9100 MiB needed" in status["message"]
    assert status["payload"] is None and status["restored"] is True


def test_a_gpu_the_host_lacks_fails_the_job_clearly(host):
    spec = host.spec("report", gpu={"devices": ["7"], "required_mib": 1, "drain_timeout": 1})
    host.start("g", spec)
    status = host.wait("g", "FAILED")
    assert "GPU 7 not found" in status["message"]


def test_preflight_reports_gpus_apps_and_python(host):
    holder = hold_gpu(host, 1000, 30)
    try:
        report = host.ok("preflight", spec=gpu_spec(host, "report"))
    finally:
        holder.kill()
        holder.wait()
    assert [g["index"] for g in report["gpus"]] == ["0"] and report["nvidia_smi"] is True
    assert {"pid": holder.pid, "used_mib": 1000} in report["apps"]
    assert report["service"] is None and report["locks"] == [{"key": "gpu-0", "held": False, "holder": None}]
    assert report["python"].count(".") == 2


def test_no_gpu_in_the_spec_never_calls_nvidia_smi(host):
    broken = host.tmp / "broken-bin"
    broken.mkdir()
    (broken / "nvidia-smi").write_text("#!/bin/sh\ntouch \"$MARKS/nvidia-smi-called\"\nexit 9\n")
    (broken / "nvidia-smi").chmod(0o755)
    host.env["PATH"] = f"{broken}:{os.environ['PATH']}"
    assert host.ok("preflight", spec=host.spec("report"))["gpus"] == []
    host.start("c", host.spec("report"))
    host.wait("c", "SUCCEEDED")
    assert not (host.marks / "nvidia-smi-called").exists()


def test_one_card_named_by_index_and_by_uuid_is_one_lock(host):
    uuid = json.loads((host.gpu_dir / "gpus.json").read_text())[0]["uuid"]
    host.start("by-index", gpu_spec(host, "sleep", "30", "0"))
    host.wait("by-index", "RUNNING")
    by_uuid = host.spec("sleep", "0", "0", gpu={"devices": [uuid], "required_mib": 0, "drain_timeout": 5})
    rc, answer = host.call("start", "--job-id", "by-uuid", spec=by_uuid)
    assert rc == 1 and answer["error"] == "busy" and answer["holder"]["job_id"] == "by-index"
    host.ok("cancel", "--job-id", "by-index")
    host.wait("by-index", "CANCELLED")


def test_preflight_probes_never_make_a_start_busy(host):
    """A probe takes a shared lock: many preflights at once must not turn a start into a false "busy"."""
    spec = gpu_spec(host, "sleep", "0", "0")
    stop = time.monotonic() + 3
    probes = [subprocess.Popen([sys.executable, "-c", PROBE_LOOP, str(SUPERVISOR), str(host.root), json.dumps(spec),
                                str(stop - time.monotonic())], env=host.env) for _ in range(3)]
    try:
        for i in range(5):
            host.start(f"p{i}", spec)  # ok() asserts it was accepted
            host.wait(f"p{i}", "SUCCEEDED")
    finally:
        for p in probes:
            p.wait(timeout=30)


PROBE_LOOP = """
import os, sys, time
sys.path.insert(0, os.path.dirname(os.path.dirname(sys.argv[1])))  # the package the supervisor's files are in
from remote_payload.supervision import locks as sup
root, end = sys.argv[2], time.monotonic() + float(sys.argv[4])
while time.monotonic() < end:  # the real probe, as fast as it goes
    sup.probe_lock("gpu-0")
"""


def test_settle_restores_even_when_the_steps_before_it_fail(tmp_path, monkeypatch):
    """nvidia-smi answering something unparseable, or a kill failing, must never skip the restore."""
    from remote_payload.supervision import ledger
    from remote_payload.supervision.files import JobPaths
    from remote_payload.supervision.record import Job, initial_status
    from remote_payload.supervision.restore import settle as sup

    paths = JobPaths(str(tmp_path), "j")
    os.makedirs(paths.dir)
    spec = {"job_id": "j", "name": "j", "service": {"manager": "none"}, "gpu": {"devices": ["0"], "required_mib": 0,
            "drain_timeout": 1}, "limits": {"grace": 0.1}}
    job = Job(paths, spec, initial_status(spec))
    job.status["payload"] = {"pid": 999999, "pgid": 999999, "start_time": 1}
    job.status["service"] = {"manager": "systemd", "unit": "u.service", "was": "active", "stopped": True}
    ledger.record_stop(str(tmp_path), "u.service", "j", job.status["service"], ["0"])  # as before every stop

    def broken(*_a, **_k):
        raise ValueError("nvidia-smi said something new")

    restored = []
    monkeypatch.setattr(sup, "query_apps", broken)
    monkeypatch.setattr(sup, "group_is_ours", broken)
    monkeypatch.setattr(sup, "bring_back", lambda j, since: restored.append(j))
    sup.settle(job, ("FAILED", "t"))
    assert restored == [job]
    events = (tmp_path / "jobs" / "j" / "events.jsonl").read_text()
    assert "nvidia-smi said something new" in events


def test_status_wait_answers_when_the_job_ends_not_at_the_bound(host):
    host.start("waited", host.spec("gate", "go"))  # a sleep of 1 s ended before a loaded machine saw it RUNNING
    host.wait("waited", "RUNNING")
    threading.Timer(1.0, (host.marks / "go").touch).start()
    began, seen = time.monotonic(), []
    while not seen or seen[-1] not in ("SUCCEEDED", "FAILED"):  # each answer: a change of state (RESTORING…)
        seen.append(host.ok("status", "--job-id", "waited", "--wait", "60")["jobs"][0]["state"])
        assert len(seen) <= 4, seen
    took = time.monotonic() - began
    assert seen[-1] == "SUCCEEDED" and took < 30, (seen, took)  # the end, not the 60 s bound
    began = time.monotonic()
    assert host.ok("status", "--job-id", "waited", "--wait", "1")["jobs"][0]["state"] == "SUCCEEDED"
    assert time.monotonic() - began < 30  # ended already: at once


@pytest.mark.parametrize("wait", ["-1", "nan", "3601"])
def test_status_wait_out_of_bounds_is_bad_args(host, wait):
    rc, answer = host.call("status", "--job-id", "x", "--wait", wait)
    assert not answer["ok"] and answer["error"] == "bad-args", answer
