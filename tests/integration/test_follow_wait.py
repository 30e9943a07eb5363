"""A `logs` call that waits sleeps until the job's dir changes or its supervisor and guard end (remote_payload/
host/changes.py): a quiet wait makes no pass of its own (it read the job ten times a second), bytes appended
and a state written are answered at once, a job whose supervisor and guard die is reaped by the waiting call
(not at its --wait's end), and where inotify cannot be had the poll still serves. Real supervisors in local
subprocesses (tests/harness/supervisor_calls.py); the `logs` verb itself runs in this process, its passes
counted."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from remote_payload.commands import Namespace
from remote_payload.host import changes
from remote_payload.verbs import logs
from tests.harness.pace import Scale
from tests.harness.supervisor_calls import SUPERVISOR, Host, pid_gone


@pytest.fixture
def host(tmp_path):
    h = Host(tmp_path)
    yield h
    h.cleanup()


def running(host: Host, job_id: str) -> tuple[dict, int]:
    """A job of the gate payload (it runs until the test says), RUNNING, and its log's size."""
    host.start(job_id, host.spec("gate", "never"))
    status = host.wait(job_id, "RUNNING")
    output = host.root / "jobs" / job_id / "output.log"
    deadline = time.monotonic() + 30
    while b"started" not in output.read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return status, output.stat().st_size


def counted(monkeypatch, name: str) -> list:
    """Each call of logs.NAME from now on: reap_if_dead reads the job's state, read_log_chunk its log (each
    pass of a `logs` call)."""
    calls: list = []
    real = getattr(logs, name)
    monkeypatch.setattr(logs, name, lambda *args: calls.append(time.monotonic()) or real(*args))
    return calls


def logs_call(host: Host, job_id: str, offset: int, wait: float) -> dict:
    return logs.cmd_logs(Namespace(job_id=job_id, root=str(host.root), offset=offset, max=1 << 20, wait=wait,
                                   stream=False, follow=False))


def test_a_quiet_wait_makes_no_pass_of_its_own(host, monkeypatch):
    _, size = running(host, "q")
    passes = counted(monkeypatch, "read_log_chunk")
    began = time.monotonic()
    answer = logs_call(host, "q", size, 3.0)
    assert answer["data_b64"] == "" and answer["state"] == "RUNNING" and time.monotonic() - began >= 3.0
    assert len(passes) <= 3, f"{len(passes)} passes in a quiet 3 s wait"  # the first, the armed one, the end


def test_bytes_appended_and_a_state_written_are_answered_at_once(host, monkeypatch):
    scale = Scale()
    _, size = running(host, "w")
    written: list = []

    def append_later() -> None:
        time.sleep(1.0)
        with open(host.root / "jobs" / "w" / "output.log", "ab") as fh:
            written.append(time.monotonic())
            fh.write(b"late line\n")
    threading.Thread(target=append_later, daemon=True).start()
    answer = logs_call(host, "w", size, 20.0)
    assert answer["next_offset"] == size + len(b"late line\n")
    assert time.monotonic() - written[0] < scale(0.5)

    (host.marks / "never").write_text("1")  # the gate opens: the payload exits, status.json is replaced
    began = time.monotonic()
    answer = logs_call(host, "w", size + len(b"late line\n"), 20.0)
    assert answer["terminal"] and time.monotonic() - began < scale(5.0), answer


def test_lines_appended_are_read_without_reading_the_state_again(host, monkeypatch):
    _, size = running(host, "l")
    states, reads = counted(monkeypatch, "reap_if_dead"), counted(monkeypatch, "read_log_chunk")

    def append_lines() -> None:
        for _ in range(10):
            time.sleep(0.2)
            with open(host.root / "jobs" / "l" / "output.log", "ab") as fh:
                fh.write(b"a line\n")
    threading.Thread(target=append_lines, daemon=True).start()
    monkeypatch.setattr(sys, "stdout", open(os.devnull, "w"))  # the frames' bytes
    answer = logs.stream_log(logs.job_paths(Namespace(job_id="l", root=str(host.root))),
                             Namespace(offset=size, max=1 << 20, wait=4.0, follow=True))
    sys.stdout.close()
    assert answer["offset"] == size + 10 * len(b"a line\n") and len(reads) >= 4
    assert len(states) <= 2, f"the state read {len(states)} times for {len(reads)} reads of the log"


def test_a_job_whose_supervisor_and_guard_die_is_reaped_by_the_waiting_call(host):
    scale = Scale()
    status, size = running(host, "d")
    call = subprocess.Popen([sys.executable, str(SUPERVISOR), "logs", "--job-id", "d", "--offset", str(size),
                             "--wait", "60", "--stream", "--follow", "--root", str(host.root)],
                            stdout=subprocess.PIPE, env=host.env)
    time.sleep(1.0)  # the call is waiting
    for sig in (signal.SIGSTOP, signal.SIGKILL):  # stopped first: neither sees the other die and writes a word
        for who in ("guard", "supervisor"):
            os.kill(status[who]["pid"], sig)
    assert pid_gone(status["guard"]["pid"]) and pid_gone(status["supervisor"]["pid"])
    killed = time.monotonic()
    out, _ = call.communicate(timeout=70)
    last = json.loads(out.splitlines()[-1])
    assert last["state"] == "LOST" and last["last"], last
    assert time.monotonic() - killed < scale(5.0), "the waiting call saw the job's end only at its --wait"


def test_where_inotify_cannot_be_had_the_poll_serves(host, monkeypatch):
    monkeypatch.setattr(changes.Changes, "inotify", lambda self: None)
    _, size = running(host, "p")
    passes = counted(monkeypatch, "read_log_chunk")
    threading.Timer(1.0, lambda: (host.marks / "never").write_text("1")).start()
    answer = logs_call(host, "p", size, 20.0)
    assert answer["terminal"] and len(passes) >= 5  # polled every POLL_S until the payload's end
