"""remote_payload/host/engine.py against the engine stand-in (tests/hosts/engine_standin.py) run as a plain process:
probe, release, resume for SGLang and vLLM, with GPU memory read through the nvidia-smi stand-in."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from remote_payload.host import engine, engine_api, engine_sglang
from remote_payload.host.gpu import query_gpus
from tests.harness.systemd_jobs import outcome
from tests.hosts import gpu_state
from tests.hosts._proc import free_port, wait_until

STANDIN = Path(__file__).parents[1] / "hosts" / "engine_standin.py"
DUMMY = Path(__file__).parents[1] / "hosts" / "dummy_inference.py"
# An H200 (143771 MiB, 615 reserved) with 60 GB weights + 60 GB KV cache + 500 MiB context: 22656 MiB free.
FREE_BEFORE = gpu_state.H200_TOTAL_MIB - 615 - 120500
PROBE = ["GET /server_info", "GET /hicache/storage-backend"]  # what the release's own probe asks


class Server:
    """One stand-in process; `calls()` lists the requests it got, in order."""

    def __init__(self, tmp_path: Path, *flags: str, engine_name: str = "sglang", script: Path = STANDIN) -> None:
        self.port = free_port()
        self.calls_file = tmp_path / f"calls-{self.port}.jsonl"
        argv = [sys.executable, str(script), "--port", str(self.port), "--gpu-dir", str(tmp_path / "gpu")]
        if script == STANDIN:
            argv += ["--engine", engine_name, "--calls", str(self.calls_file), "--ready-delay", "0", *flags]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_until(lambda: self.answers("/health"), timeout=20, what="the stand-in to serve")
        self.calls_file.unlink(missing_ok=True)  # the readiness polls are not the test's calls

    def answers(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(self.url + path, timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def calls(self) -> list[str]:
        if not self.calls_file.exists():
            return []
        lines = [json.loads(line) for line in self.calls_file.read_text().splitlines()]
        return [f"{c['method']} {c['path']}" + (f" {c['body']}" if c["body"] else "") for c in lines
                if c["path"] != "/standin_state"]

    def state(self) -> dict:
        with urllib.request.urlopen(self.url + "/standin_state", timeout=2) as answer:
            return json.loads(answer.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@pytest.fixture
def gpu(tmp_path, monkeypatch):
    """The nvidia-smi stand-in on PATH, reading this test's state dir (one H200)."""
    gpu_state.make_state_dir(tmp_path / "gpu")
    monkeypatch.setenv("RUNNER_FAKE_GPU_DIR", str(tmp_path / "gpu"))
    monkeypatch.setenv("PATH", f"{gpu_state.STANDIN.parent}{os.pathsep}{os.environ['PATH']}")
    return lambda: query_gpus(["0"])[0]["free_mib"]


@pytest.fixture
def servers(tmp_path, gpu):
    started = []

    def start(*flags: str, **kw) -> Server:
        started.append(Server(tmp_path, *flags, **kw))
        return started[-1]
    yield start
    for server in started:
        server.stop()


def service(server: Server, free: str = "sglang", **extra) -> dict:
    return dict({"free": free, "health_url": server.url + "/health"}, **extra)


def soon(seconds: float = 20.0) -> float:
    return time.monotonic() + seconds


# ── SGLang ────────────────────────────────────────────────────────────────────────────────────────────

def test_kv_cache_alone_when_it_frees_enough_and_resume_brings_it_back(servers, gpu):
    server = servers("--memory-saver", "--weights-cpu-backup")
    assert gpu() == FREE_BEFORE
    saved = []
    record = engine.release(service(server), 30000, gpu, soon(), save=lambda r: saved.append(json.loads(json.dumps(r))))
    assert server.calls() == [*PROBE, "GET /get_load", "POST /flush_cache",
                              'POST /pause_generation {"mode": "in_place"}', "POST /flush_cache",
                              'POST /release_memory_occupation {"tags": ["kv_cache"]}']
    assert [s["step"] for s in record["steps"]] == ["pause", "kv_cache"] and not engine.pending(record)
    assert gpu() == FREE_BEFORE + 60000
    # recorded before it was asked: a restorer that finds this knows the release may have happened
    assert any({"step": "kv_cache", "done": False} in r["steps"] for r in saved)
    assert server.state()["on_gpu"] == {"weights": True, "kv_cache": False}

    timings = engine.resume(record, service(server, record["engine"]), soon())
    assert server.calls()[7:] == ['POST /resume_memory_occupation {"tags": ["kv_cache"]}',
                                  "POST /continue_generation {}", "GET /health_generate"]
    assert server.proc.poll() is None and server.state()["pid"] == server.proc.pid  # the same process serves
    assert gpu() == FREE_BEFORE and set(timings) == {"resume_s", "health_s", "hold_s"}
    assert timings["hold_s"] <= timings["resume_s"] + 5  # from the pause to serving again, not to /health
    assert "release_s" in record["timings"]


def test_weights_too_when_the_kv_cache_is_not_enough_resumed_weights_first(servers, gpu):
    server = servers("--memory-saver", "--weights-cpu-backup")
    record = engine.release(service(server, pause_mode="abort"), 100000, gpu, soon())
    assert server.calls()[2:] == ["GET /get_load", 'POST /pause_generation {"mode": "abort"}',
                                  'POST /release_memory_occupation {"tags": ["kv_cache"]}',
                                  'POST /release_memory_occupation {"tags": ["weights"]}']
    assert gpu() == FREE_BEFORE + 120000
    engine.resume(record, service(server, record["engine"]), soon())
    assert server.calls()[6:9] == ['POST /resume_memory_occupation {"tags": ["weights"]}',
                                   'POST /resume_memory_occupation {"tags": ["kv_cache"]}',
                                   "POST /continue_generation {}"]
    assert server.state() == dict(server.state(), paused=False, weights_intact=True,
                                  on_gpu={"weights": True, "kv_cache": True})


def test_weights_without_their_cpu_backup_are_never_released(servers, gpu):
    server = servers("--memory-saver")
    record = engine.release(service(server), 100000, gpu, soon())
    assert [s["step"] for s in record["steps"]] == ["pause", "kv_cache"] and record["short_after"] == "kv_cache"
    assert server.state()["weights_intact"] and server.state()["on_gpu"]["weights"]


def test_a_server_without_the_memory_saver_is_refused_before_anything_is_touched(servers, gpu):
    server = servers()  # its release would answer 200 and free nothing
    with pytest.raises(engine.Unsupported, match="without --enable-memory-saver"):
        engine.release(service(server), 30000, gpu, soon())
    assert server.calls() == ["GET /server_info"]
    assert not server.state()["paused"] and gpu() == FREE_BEFORE


def test_a_server_that_is_not_sglang_is_refused(servers, gpu):
    server = servers(script=DUMMY)
    with pytest.raises(engine.Unsupported, match="/server_info answered 404: not an SGLang server runner supports"):
        engine.probe(service(server), soon())


def test_the_default_drain_lets_the_requests_in_flight_finish_and_aborts_none(servers, gpu):
    server = servers("--memory-saver", "--clients", "3", "--request-s", "1.5")
    record = engine.release(service(server), 30000, gpu, soon(30))
    assert server.calls()[2:] == ["GET /get_load", "POST /flush_cache", 'POST /pause_generation {"mode": "in_place"}',
                                  "POST /flush_cache", 'POST /release_memory_occupation {"tags": ["kv_cache"]}']
    assert outcome(server.state()["load"]) == {"running": 0, "held": 0, "completed": 3, "aborted": 0}
    assert record["mode"] == "drain" and record["drain"]["outcome"] == "drained" and record["drain"]["pauses"] == 1
    clients = record["clients"]
    # the 3 finished while SGLang served (the drain); at the pause that held none was in flight
    assert record["drain"]["in_flight"] == 3 and (clients["at_pause"], clients["aborted"]) == (0, 0)
    assert clients["drained_s"] >= 1.0  # the requests' own 1.5 s, less the time before the load was read
    assert record["paused_at"] >= record["released_at"]
    engine.resume(record, service(server, record["engine"]), soon())
    assert server.calls()[-2:] == ["POST /continue_generation {}", "GET /health_generate"]


def test_a_request_that_slips_in_before_the_pause_runs_to_its_end_and_the_drain_goes_on(servers, gpu):
    server = servers("--memory-saver", "--clients", "1", "--request-s", "0.5", "--slip-in", "2")
    record = engine.release(service(server), 30000, gpu, soon(30))
    assert server.calls()[2:] == ["GET /get_load", "POST /flush_cache", 'POST /pause_generation {"mode": "in_place"}',
                                  "POST /flush_cache", "POST /continue_generation {}", "POST /flush_cache",
                                  'POST /pause_generation {"mode": "in_place"}', "POST /flush_cache",
                                  'POST /release_memory_occupation {"tags": ["kv_cache"]}']
    assert outcome(server.state()["load"]) == {"running": 0, "held": 0, "completed": 3, "aborted": 0}
    assert record["drain"]["pauses"] == 2 and [s["step"] for s in record["steps"]] == ["pause", "kv_cache"]


def test_past_the_drain_bound_nothing_is_released_and_nothing_aborted(servers, gpu):
    server = servers("--memory-saver", "--clients", "2", "--request-s", "0.3", "--loop")  # never idle
    saved = []
    began = time.monotonic()
    with pytest.raises(engine_sglang.DrainTimeout, match=r"still had 2 requests in flight after service.drain_timeout "
                                                  r"\(2 s\): nothing was released"):
        engine.release(service(server, drain_timeout=2.0), 30000, gpu, soon(30), save=saved.append)
    assert time.monotonic() - began < 10
    assert "POST /release_memory_occupation" not in " ".join(server.calls())
    state = server.state()
    assert not state["paused"] and state["on_gpu"] == {"weights": True, "kv_cache": True}
    assert state["load"]["aborted"] == 0 and state["load"]["completed"] > 0
    assert saved[-1]["steps"] == [] and saved[-1]["drain"]["outcome"] == "timeout"
    assert gpu() == FREE_BEFORE


def test_past_the_drain_bound_drain_fallback_abort_aborts_the_rest_and_releases(servers, gpu):
    server = servers("--memory-saver", "--clients", "2", "--request-s", "0.3", "--loop")  # never idle
    record = engine.release(service(server, drain_timeout=2.0, drain_fallback="abort"), 30000, gpu, soon(30))
    calls = server.calls()
    assert calls[-2:] == ['POST /pause_generation {"mode": "abort"}',
                          'POST /release_memory_occupation {"tags": ["kv_cache"]}'], calls
    assert 'POST /pause_generation {"mode": "in_place"}' not in calls  # never idle: the drain never paused
    assert record["mode"] == "drain" and record["drain"]["outcome"] == "timeout"
    assert record["drain"]["fallback"] == "abort" and [s["step"] for s in record["steps"]] == ["pause", "kv_cache"]
    clients = record["clients"]
    assert clients["at_pause"] == 2 and clients["aborted"] == clients["truncated"] == 2 and clients["held"] == 0
    assert clients["drain_timed_out_s"] >= 2.0
    state = server.state()
    assert state["paused"] and not state["on_gpu"]["kv_cache"] and state["load"]["aborted"] == 2
    assert state["load"]["completed"] > 0  # served through the drain until the bound
    engine.resume(record, service(server, record["engine"]), soon())
    assert not server.state()["paused"]


def test_abort_counts_the_requests_it_aborted(servers, gpu):
    server = servers("--memory-saver", "--clients", "2", "--request-s", "30")
    record = engine.release(service(server, pause_mode="abort"), 30000, gpu, soon())
    assert outcome(server.state()["load"]) == {"running": 0, "held": 0, "completed": 0, "aborted": 2}
    assert record["clients"] == {"at_pause": 2, "held": 0, "aborted": 2, "truncated": 2, "refused": 0}


@pytest.mark.parametrize("mode, why", [("retract", "retract needs SGLang 0.5.21 or later"),
                                       ("in_place", "SGLang's in_place keeps the running requests")])
def test_a_mode_sglang_cannot_release_after_touches_nothing(servers, gpu, mode, why):
    server = servers("--memory-saver", "--clients", "2", "--request-s", "30")
    with pytest.raises(engine.Unsupported, match=f"service.pause_mode {mode}: .*{why}"):
        engine.release(service(server, pause_mode=mode), 30000, gpu, soon())
    assert server.calls() == ["GET /server_info"] and not server.state()["paused"]


def test_the_standin_aborts_on_a_release_while_generating(servers):
    """What the pause protects against: SGLang's scheduler asserts and the whole server process dies."""
    server = servers("--memory-saver")
    record = dict(engine.new_record(service(server), engine.probe(service(server), soon())), steps=[])
    with pytest.raises(engine.EngineError, match="did not answer"):
        engine_sglang.release_tag(engine_api.Api(server.url, {}), record, "kv_cache", soon(), lambda r: None)
    assert server.proc.wait(timeout=10) == 134


def test_an_api_that_does_not_answer_the_resume_fails_within_the_deadline(servers, gpu):
    server = servers("--memory-saver", "--hang", "/resume_memory_occupation")
    record = engine.release(service(server), 30000, gpu, soon())
    began = time.monotonic()
    with pytest.raises(engine.EngineError, match="resume_memory_occupation did not answer"):
        engine.resume(record, service(server, record["engine"]), time.monotonic() + 2)
    assert time.monotonic() - began < 10  # bounded by the deadline, not by the engine


def test_a_release_whose_answer_was_never_seen_is_not_guessed_at(servers):
    server = servers("--memory-saver")
    record = dict(engine.new_record(service(server), {"release": None, "mode": "drain"}),
                  steps=[{"step": "pause", "done": True}, {"step": "kv_cache", "done": False}])
    with pytest.raises(engine.EngineError, match="kv_cache was asked but its answer never seen"):
        engine.resume(record, service(server, record["engine"]), soon())
    assert server.calls() == []  # nothing asked: the caller restarts the unit instead


def test_a_refused_step_is_dropped_from_the_record(servers, gpu):
    server = servers("--memory-saver")
    with pytest.raises(engine.Unsupported, match="service.pause_mode sideways: not a pause mode"):
        engine.release(service(server, pause_mode="sideways"), 30000, gpu, soon())
    saved = engine.new_record(service(server), {"release": None, "mode": "sideways"})
    with pytest.raises(engine.EngineError, match="answered 400"):
        engine_api.step(engine_api.Api(server.url, {}), saved, "pause", "/pause_generation", {"mode": "sideways"},
                        soon(), lambda r: None)
    assert saved["steps"] == []


def test_a_closed_port_is_an_engine_error_not_a_hang(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(engine.EngineError, match="cannot connect"):
        engine.probe({"free": "sglang", "api_url": url}, soon(5))


def test_api_url_defaults_to_the_health_urls_origin():
    assert engine.api_url({"health_url": "http://127.0.0.1:30000/health"}) == "http://127.0.0.1:30000"
    assert engine.api_url({"api_url": "http://127.0.0.1:8/x/", "health_url": "http://h:1/health"}) == \
        "http://127.0.0.1:8/x"


# ── vLLM ──────────────────────────────────────────────────────────────────────────────────────────────

def test_vllm_sleeps_and_wakes(servers, gpu):
    server = servers("--dev-mode", "--sleep-mode", engine_name="vllm")
    record = engine.release(service(server, "vllm"), 30000, gpu, soon())
    assert server.calls()[:6] == ["GET /version", "GET /is_sleeping", "GET /server_info", "GET /metrics",
                                  "POST /sleep", "GET /is_sleeping"]
    assert gpu() == FREE_BEFORE + 120000 and server.state()["sleeping"]
    engine.resume(record, service(server, record["engine"]), soon())
    assert server.calls()[-3:] == ["POST /wake_up", "GET /is_sleeping", "GET /health"]
    assert gpu() == FREE_BEFORE and server.state()["pid"] == server.proc.pid


@pytest.mark.parametrize("flags, why", [((), "404: start vLLM with VLLM_SERVER_DEV_MODE=1"),
                                        (("--dev-mode",), "without --enable-sleep-mode")])
def test_vllm_without_sleep_mode_is_refused_before_anything_is_touched(servers, gpu, flags, why):
    server = servers(*flags, engine_name="vllm")
    with pytest.raises(engine.Unsupported, match=why):
        engine.release(service(server, "vllm"), 30000, gpu, soon())
    assert "POST /sleep" not in server.calls() and gpu() == FREE_BEFORE


def test_vllm_resume_after_a_sleep_that_never_happened_only_checks(servers):
    server = servers("--dev-mode", "--sleep-mode", engine_name="vllm")
    record = dict(engine.new_record(service(server, "vllm"), engine.probe(service(server, "vllm"), soon())),
                  steps=[{"step": "sleep", "done": False}])
    engine.resume(record, service(server, record["engine"]), soon())
    assert "POST /wake_up" not in server.calls()


# ── downtime accounting ───────────────────────────────────────────────────────────────────────────────

def test_downtime_has_the_same_parts_for_every_method():
    stopped = {"stopped_at": 100.0, "freed_at": 101.0, "resumed": {"how": "start", "resume_s": 2.0, "health_s": 3.0}}
    parts = engine.downtime(stopped, {"drained_after_s": 0.5}, 130.0, 135.0, True)
    assert parts == {"method": "stop", "not_serving_s": 35.0, "release_s": 1.0, "drain_s": 0.5, "payload_s": 28.5,
                     "resume_s": 2.0, "health_s": 3.0}
    released = dict(stopped, released={"engine": "sglang"}, resumed={"how": "api", "resume_s": 0.1, "health_s": 0.2})
    assert set(engine.downtime(released, None, 130.0, 135.0, True)) == set(parts)
    assert engine.downtime(released, None, 130.0, 135.0, True)["method"] == "sglang"
    assert engine.downtime(stopped, None, 130.0, 135.0, False)["not_serving_s"] is None  # still not serving
    adopted = engine.downtime({"stopped_at": 100.0}, None, 130.0, 135.0, True)
    assert adopted["release_s"] is None and adopted["payload_s"] is None and adopted["not_serving_s"] == 35.0
