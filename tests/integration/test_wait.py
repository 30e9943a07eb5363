"""runner wait: bounded tail calls until terminal or timeout (scripted tail), and the real CLI on the local host."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.commands import unattended
from runner.commands.controller import TailOutcome
from runner.errors import HostKeyError, TransportError

REPO = Path(__file__).resolve().parents[2]


class ScriptedTail:
    """Stands in for controller.tail: answers from a list (exceptions raised), records each max_wait."""

    def __init__(self, answers, clock=None, step=0.0):
        self.answers, self.waits, self.clock, self.step = list(answers), [], clock, step

    def __call__(self, job_id, *, store, out, follow, max_wait, from_start):
        assert follow and not from_start
        self.waits.append(max_wait)
        if self.clock:
            self.clock.now += self.step or max_wait
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        state, data = answer
        out.write(data)
        return TailOutcome(job_id, state, 0 if state == "SUCCEEDED" else None, state != "RUNNING", 0, len(data))


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_wait_prints_everything_until_terminal():
    tail = ScriptedTail([("RUNNING", b"a\n"), ("RUNNING", b""), ("SUCCEEDED", b"b\n")])
    out = io.BytesIO()
    outcome = unattended.wait("j", store=None, out=out, timeout=600, chunk=50, tail=tail)
    assert (outcome.state, outcome.terminal, outcome.calls, outcome.printed) == ("SUCCEEDED", True, 3, 4)
    assert out.getvalue() == b"a\nb\n" and all(w <= 50 for w in tail.waits)


def test_wait_gives_up_at_the_timeout_and_never_asks_past_it():
    clock = Clock()
    tail = ScriptedTail([("RUNNING", b"")] * 10, clock=clock)
    outcome = unattended.wait("j", store=None, out=io.BytesIO(), timeout=120, chunk=50, tail=tail, clock=clock)
    assert not outcome.terminal and outcome.state == "RUNNING"
    assert tail.waits == [50, 50, 20] and clock.now == 120


def test_a_lost_link_after_the_first_call_is_retried():
    notes = []
    tail = ScriptedTail([("RUNNING", b"x"), TransportError("link lost"), ("FAILED", b"y")])
    outcome = unattended.wait("j", store=None, out=io.BytesIO(), timeout=60, tail=tail, progress=notes.append)
    assert (outcome.state, outcome.printed) == ("FAILED", 2) and "link lost" in notes[0]


@pytest.mark.parametrize("answers", [[TransportError("no route")], [("RUNNING", b""), HostKeyError("changed key")]])
def test_an_unreachable_host_or_a_refused_key_is_raised(answers):
    with pytest.raises(TransportError):
        unattended.wait("j", store=None, out=io.BytesIO(), timeout=60, tail=ScriptedTail(answers))


def runner(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner", *args], capture_output=True, cwd=REPO, timeout=timeout)


def submit_demo(root: Path, seconds: int) -> str:
    done = runner("submit", "jobs/demo.yaml", "--set", f"payload.args.seconds={seconds}", "--set", f"host.root={root}",
                  "--json")
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)["job_id"]


def test_cli_wait_streams_the_whole_log_once_and_exits_with_the_verdict(tmp_path):
    job = submit_demo(tmp_path / "host root", 3)
    done = runner("wait", job, "--timeout", "2m")
    assert done.returncode == 0, done.stderr.decode()
    log = (tmp_path / "host root" / "jobs" / job / "output.log").read_bytes()
    assert done.stdout == log and b'"event": "done"' in log
    assert f"{job} ended SUCCEEDED".encode() in done.stderr
    again = runner("wait", job, "--timeout", "30s")
    assert again.returncode == 0 and again.stdout == b""  # nothing printed twice


def test_cli_wait_exits_75_at_the_timeout_and_the_job_keeps_running(tmp_path):
    job = submit_demo(tmp_path / "host root", 30)
    started = time.monotonic()
    done = runner("wait", job, "--timeout", "3s")
    assert done.returncode == 75 and time.monotonic() - started < 3 + 10
    assert b"still RUNNING after 3s" in done.stderr
    assert runner("cancel", job).returncode == 0


def test_cli_wait_refuses_a_bad_timeout():
    done = runner("wait", "some-job", "--timeout", "soon")
    assert done.returncode == 2 and b"--timeout: not a duration" in done.stderr
