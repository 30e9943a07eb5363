"""An engine that answers badly (tests/hosts/engine_standin.py --misbehave, a labelled stand-in): every way its
HTTP answer can go wrong is an EngineError within the caller's deadline, never a crash, a hang, a huge read or a
followed redirect. `call` first, against the stand-in run as a plain process (fast); then every restorer on the
confined systemd test host, each bringing the unit back by the documented restart (tests marked systemd)."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from remote_payload.host import engine
from tests.hosts import gpu_state
from tests.hosts._proc import free_port, wait_until

STANDIN = Path(__file__).parent / "hosts" / "engine_standin.py"
KINDS = ("cut-short", "trickle", "huge", "header-flood", "bad-status-line", "long-header-line", "reset", "not-json")
BOUND_S = 2.0  # the deadline each call gets here


class Standin:
    """The SGLang stand-in as a plain process; `misbehave`: ROUTE=KIND[:ARG] rules."""

    def __init__(self, tmp: Path, *misbehave: str) -> None:
        self.port = free_port()
        self.calls_file = tmp / f"calls-{self.port}.jsonl"
        gpu = gpu_state.make_state_dir(tmp / f"gpu-{self.port}")
        argv = [sys.executable, str(STANDIN), "--engine", "sglang", "--port", str(self.port), "--gpu-dir", str(gpu),
                "--calls", str(self.calls_file), "--ready-delay", "0", "--memory-saver"]
        self.proc = subprocess.Popen(argv + [f"--misbehave={rule}" for rule in misbehave],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_until(self.serves, timeout=20, what="the stand-in to serve")
        self.calls_file.unlink(missing_ok=True)

    def serves(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def paths(self) -> list[str]:
        text = self.calls_file.read_text() if self.calls_file.exists() else ""
        return [json.loads(line)["path"] for line in text.splitlines()]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    server = Standin(tmp_path_factory.mktemp("bad"), *(f"/{kind}={kind}" for kind in KINDS))
    yield server
    server.stop()


def timed_failure(method: str, url: str, body=None) -> tuple[str, float]:
    began = time.monotonic()
    with pytest.raises(engine.EngineError) as caught:
        engine.call(method, url, began + BOUND_S, body)
    return str(caught.value), time.monotonic() - began


@pytest.mark.parametrize("kind", KINDS)
def test_every_bad_answer_is_an_engine_error_within_the_deadline(bad, kind):
    message, seconds = timed_failure("POST", f"{bad.url}/{kind}", {"tags": ["kv_cache"]})
    print(f"{kind}: EngineError after {seconds:.2f} s: {message[:120]}")
    assert seconds < BOUND_S + 1.0, f"{kind} took {seconds:.1f} s"  # a trickle or a 1 GiB body never holds it longer


def test_a_huge_body_is_refused_at_the_cap_not_read_to_its_end(bad):
    message, _ = timed_failure("GET", f"{bad.url}/huge")
    assert f"over {engine.MAX_BODY_BYTES} bytes" in message


def test_a_trickled_body_ends_at_the_deadline_not_per_read(bad):
    message, seconds = timed_failure("GET", f"{bad.url}/trickle")
    assert "deadline" in message or "timed out" in message, message
    assert seconds >= BOUND_S - 0.1


def test_a_redirect_to_another_port_is_not_followed(tmp_path):
    good = Standin(tmp_path / "good")
    redirecting = Standin(tmp_path / "bad", f"/release_memory_occupation=redirect:{good.url}/release_memory_occupation")
    try:
        message, _ = timed_failure("POST", redirecting.url + "/release_memory_occupation", {"tags": ["kv_cache"]})
        assert "302" in message and "not followed" in message
        assert good.paths() == []  # the other port never heard of it
    finally:
        good.stop()
        redirecting.stop()


def test_a_redirect_to_ftp_opens_no_connection(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.5)
    accepted = []

    def watch():
        try:
            accepted.append(listener.accept())
        except OSError:
            pass
    threading.Thread(target=watch, daemon=True).start()
    ftp = f"ftp://127.0.0.1:{listener.getsockname()[1]}/x"
    redirecting = Standin(tmp_path, f"/release_memory_occupation=redirect:{ftp}")
    try:
        message, _ = timed_failure("POST", redirecting.url + "/release_memory_occupation", {"tags": ["kv_cache"]})
        assert "not followed" in message
        time.sleep(0.6)
        assert accepted == []
    finally:
        redirecting.stop()
        listener.close()


def test_a_closed_port_and_a_url_that_is_not_http_are_engine_errors():
    timed_failure("GET", f"http://127.0.0.1:{free_port()}/health")
    timed_failure("GET", "ftp://127.0.0.1:21/health")
    timed_failure("GET", "http://127.0.0.1:notaport/health")


def test_json_nested_past_the_parsers_depth_is_an_engine_error_not_a_crash():
    with pytest.raises(engine.EngineError):
        engine.parse_body(b"[" * 200000, "GET /x")
    assert engine.parse_body(b" ", "GET /x") is None and engine.parse_body(b'{"a": 1}', "GET /x") == {"a": 1}


def test_a_good_engine_still_answers(tmp_path):
    good = Standin(tmp_path)
    try:
        assert engine.call("GET", good.url + "/get_server_info", time.monotonic() + 5)[1]["enable_memory_saver"]
        assert engine.call("GET", good.url + "/nope", time.monotonic() + 5) == (404, {"detail": "Not Found"})
    finally:
        good.stop()
