"""`runner results JOB` is one host call on one connection: the `result` answer carries the service windows of
the job beside its result.json, so the window line needs no `status` call of its own.

FAKE, labelled: `CountingTransport` stands in for the host. It answers each supervisor verb with a canned line
(what the real supervisor answers for a job that stopped a service) and records the verbs it was asked; the real
HostClient, controller and CLI read it.
"""
from __future__ import annotations

import base64
import json
import time

import pytest

from runner.cli import cli
from runner.commands import controller
from runner.remote.bundles import Bundle
from runner.remote.host import HostClient
from runner.remote.transport import Completed
from runner.state.store import JobRecord, Store

WINDOW = {"method": "stop", "not_serving_s": 26.2, "release_s": 0.5, "payload_s": 20.0, "health_s": 5.7}
ANSWERS = {
    "result": {"ok": True, "job_id": "j1", "result": {"rows": [{"size": 1, "median_us": 5.0}]},
               "windows": [{"unit": "sglang.service", "window": WINDOW}]},
    # What a `status` call would find (a controller that still asked it would print the same window).
    "status": {"ok": True, "jobs": [{"job_id": "j1", "state": "SUCCEEDED", "service": {
        "unit": "sglang.service", "was": "active", "now": "active", "stopped": True, "downtime_s": 26.2,
        "downtime": WINDOW}}]},
}


class CountingTransport:
    """FAKE host: answers verb SUB with ANSWERS[SUB] and records SUB."""

    name = "counting"

    def __init__(self) -> None:
        self.verbs: list[str] = []

    def run(self, argv, *, stdin=b"", deadline=None) -> Completed:
        verb = base64.b64decode(argv[-1]).decode().split("\0")[4]  # [program, -c, root, digest, SUB, args…]
        self.verbs.append(verb)
        return Completed(tuple(argv), 0, (json.dumps(ANSWERS[verb]) + "\n").encode(), b"")

    def close(self) -> None:
        pass


@pytest.fixture
def host(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNNER_STATE_DIR", str(tmp_path / "state"))
    Store().save(JobRecord(job_id="j1", name="j", host={"address": "box"}, spec_path="x", submitted_at=time.time(),
                           last_state="SUCCEEDED"))
    transport, connections = CountingTransport(), []

    def connect(_host, bundle=None, deadline=None, payload=None):
        connections.append(_host)
        return HostClient(transport, root="~/.runner", python="python3", bundle=Bundle({}), deadline=deadline)

    monkeypatch.setattr(controller, "connect", connect)
    return transport, connections


def test_results_is_one_host_call_and_shows_the_window(host, capsys):
    transport, connections = host
    with pytest.raises(SystemExit) as exited:
        cli.main(["results", "j1"])
    captured = capsys.readouterr()
    assert exited.value.code == 0, captured.err
    assert transport.verbs == ["result"] and len(connections) == 1
    assert "service window (stop): not serving 26.2 s (release 0.5, payload 20.0, health 5.7 s)" in captured.err
    assert "median_us" in captured.out or "5.0" in captured.out


def test_the_window_reaches_the_history_from_the_same_call(host, capsys):
    transport, _connections = host
    with pytest.raises(SystemExit):
        cli.main(["results", "j1", "--json"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["history", "--json", "--metric", "not_serving_s"])
    runs = json.loads(capsys.readouterr().out)
    assert transport.verbs == ["result"]
    assert runs[0]["metrics"]["not_serving_s"]["value"] == pytest.approx(26.2)
