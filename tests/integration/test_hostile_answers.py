"""A host that answers outside the wire contract (a broken or compromised supervisor, a payload that rewrote
its status.json): every command exits 3 with "the host answered something runner does not understand (VERB:
field: why)", never a traceback, and nothing of the answer reaches the local index (cursor, state).

FAKE, labelled: `CannedTransport` stands in for the host. It answers each supervisor subcommand with a canned
stdout line instead of running the uploaded supervisor, which is what a compromised host can do; the real
HostClient (runner/remote/host.py) reads it through the real transport interface.
"""
from __future__ import annotations

import base64
import json
import time

import pytest

from runner.cli import cli
from runner.commands import controller
from runner.deadline import Deadline
from runner.errors import TransportError
from runner.remote.bundles import Bundle
from runner.remote.host import HostClient
from runner.remote.transport import Completed
from runner.state.store import JobRecord, Store

MESSAGE = "the host answered something runner does not understand"


class CannedTransport:
    """FAKE host: answers subcommand SUB with `answers[SUB]` (bytes of stdout, exit 0)."""

    name = "canned"

    def __init__(self, answers: dict[str, bytes]) -> None:
        self.answers = answers

    def run(self, argv, *, stdin=b"", deadline=None) -> Completed:
        words = base64.b64decode(argv[-1]).decode().split("\0")  # [program, -c, root, digest, SUB, args…]
        return Completed(tuple(argv), 0, self.answers[words[4]], b"")

    def close(self) -> None:
        pass


def line(obj) -> bytes:
    return (json.dumps(obj) + "\n").encode()


def good_chunk(data: bytes = b"more\n", offset: int = 5, state: str = "RUNNING") -> dict:
    return {"ok": True, "offset": offset, "next_offset": offset + len(data), "size": offset + len(data),
            "data_b64": base64.b64encode(data).decode(), "state": state, "terminal": state == "SUCCEEDED",
            "exit_code": None}


def good_job(**changes) -> dict:
    job = {"job_id": "j1", "state": "RUNNING", "phase": "payload running", "message": None, "created_at": 1.0,
           "started_at": 2.0, "ended_at": None, "updated_at": 3.0, "now": 4.0, "exit_code": None,
           "service": {"manager": "none", "unit": None, "was": None, "now": None, "stopped": False,
                       "stopped_at": None, "restored_at": None, "downtime_s": None, "healthy": None},
           "progress": {"phase": "run", "phase_status": "start", "rows_done": 1, "rows_expected": 4, "last_t": 3.0,
                        "errors": 0, "output_bytes": 10, "silent_s": 0.5}, "supervisor_pid": 10}
    job.update(changes)
    return job


DEEP = b'{"ok": true, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"


def with_(base: dict, **changes) -> bytes:
    return line({**base, **changes})


def without(base: dict, key: str) -> bytes:
    return line({k: v for k, v in base.items() if k != key})


BAD_LOGS = {
    "bad base64": (with_(good_chunk(), data_b64="!!!not base64!!!"), "logs: data_b64: not base64"),
    "next_offset text": (with_(good_chunk(), next_offset="abc"), "logs: next_offset: expected an integer >= 0"),
    "next_offset negative": (with_(good_chunk(), next_offset=-7), "logs: next_offset: expected an integer >= 0"),
    "next_offset not offset plus data": (with_(good_chunk(), next_offset=500, size=900), "logs: next_offset: not"),
    "next_offset past size": (with_(good_chunk(), size=6), "logs: next_offset: past the log's size"),
    "another offset": (with_(good_chunk(offset=0), next_offset=5), "logs: offset: 5 asked for, 0 answered"),
    "missing state": (without(good_chunk(), "state"), "logs: state: missing"),
    "terminal text": (with_(good_chunk(), terminal="yes"), "logs: terminal: expected true or false"),
    "size float": (with_(good_chunk(), size=10.5), "logs: size: expected an integer >= 0"),
    "escape state": (with_(good_chunk(), state="\x1b]52;c;aWQ=\x07"), "logs: state: expected a job state"),
    "terminal disagrees": (with_(good_chunk(), terminal=True), "logs: terminal: disagrees with state"),
    "exit_code text": (with_(good_chunk(), exit_code="0"), "logs: exit_code: expected an integer"),
    "more than asked": (line(good_chunk(b"x" * ((1 << 20) + 1))),
                        "logs: data_b64: 1048577 bytes, more than the 1048576 bytes asked for"),
    "far more than asked": (line(good_chunk(b"x" * (20 << 20))), "logs: data_b64: more than the 1048576 bytes"),
    "deep JSON": (DEEP, "logs: answer: nested deeper than"),
    "ok text": (with_(good_chunk(), ok="true"), "logs: ok: expected true or false"),
    "a list for a number": (with_(good_chunk(), next_offset=[10]), "logs: next_offset: expected an integer >= 0"),
}


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNNER_STATE_DIR", str(tmp_path / "state"))
    s = Store()
    s.save(JobRecord(job_id="j1", name="j", host={"address": "local"}, spec_path="x", submitted_at=time.time(),
                     cursor=5, last_state="RUNNING"))
    return s


def canned_host(monkeypatch, answers: dict[str, bytes]) -> None:
    def connect(_host, bundle=None, deadline=None, payload=None):
        return HostClient(CannedTransport(answers), root="~/.runner", python="python3", bundle=Bundle({}),
                          deadline=deadline)
    monkeypatch.setattr(controller, "connect", connect)


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exited:
        cli.main(list(argv))
    captured = capsys.readouterr()
    return exited.value.code, captured.err + captured.out


def test_a_well_formed_answer_passes(store, monkeypatch, capsysbinary):
    canned_host(monkeypatch, {"logs": line(good_chunk())})
    with pytest.raises(SystemExit) as exited:
        cli.main(["tail", "j1"])
    assert exited.value.code == 75 and capsysbinary.readouterr().out == b"more\n"
    assert store.load("j1").cursor == 10


@pytest.mark.parametrize("answer, why", BAD_LOGS.values(), ids=BAD_LOGS.keys())
def test_tail_refuses_a_bad_logs_answer_and_keeps_the_cursor(store, monkeypatch, capsys, answer, why):
    canned_host(monkeypatch, {"logs": answer})
    code, output = run_cli(capsys, "tail", "j1")
    assert code == 3 and f"{MESSAGE} ({why}" in output, output
    assert "Traceback" not in output and "\x1b" not in output
    record = store.load("j1")
    assert (record.cursor, record.last_state) == (5, "RUNNING")


def test_an_answer_line_over_the_cap_is_refused_unparsed(store, monkeypatch, capsys):
    huge = b'{"ok": true, "data_b64": "' + b"A" * (33 << 20) + b'"}\n'
    canned_host(monkeypatch, {"logs": huge})
    code, output = run_cli(capsys, "tail", "j1")
    assert code == 3 and f"{MESSAGE} (logs: answer: " in output and "more than the" in output
    assert store.load("j1").cursor == 5


BAD_STATUS = {
    "no jobs": (line({"ok": True, "jobs": []}), "status: jobs: 1 asked for, 0 answered"),
    "another job": (line({"ok": True, "jobs": [good_job(job_id="j2")]}), "status: jobs.0.job_id: not the job"),
    "jobs text": (line({"ok": True, "jobs": "j1"}), "status: jobs: expected a list"),
    "forged state": (line({"ok": True, "jobs": [good_job(state="HACKED")]}), "status: jobs.0.state: expected a job"),
    "escape state": (line({"ok": True, "jobs": [good_job(state="\x1b[2J")]}), "status: jobs.0.state"),
    "rows text": (line({"ok": True, "jobs": [good_job(progress={"rows_done": "many"})]}),
                  "status: jobs.0.progress.rows_done: expected an integer >= 0"),
    "service text": (line({"ok": True, "jobs": [good_job(service="up")]}),
                     "status: jobs.0.service: expected an object"),
    "downtime text": (line({"ok": True, "jobs": [good_job(service={"downtime_s": "long"})]}),
                      "status: jobs.0.service.downtime_s: expected a finite number"),
    "started_at text": (line({"ok": True, "jobs": [good_job(started_at="yesterday")]}),
                        "status: jobs.0.started_at: expected a finite number"),
    "message number": (line({"ok": True, "jobs": [good_job(message=5)]}), "status: jobs.0.message: expected text"),
    "missing state": (line({"ok": True, "jobs": [{"job_id": "j1"}]}), "status: jobs.0.state: missing"),
    "variant args list": (line({"ok": True, "jobs": [good_job(progress={"rows_done": 0, "variant": {"args": [1]}})]}),
                          "status: jobs.0.progress.variant.args: expected an object"),
}


@pytest.mark.parametrize("answer, why", BAD_STATUS.values(), ids=BAD_STATUS.keys())
def test_status_refuses_a_bad_answer_and_keeps_the_state(store, monkeypatch, capsys, answer, why):
    canned_host(monkeypatch, {"status": answer})
    code, output = run_cli(capsys, "status", "j1")
    assert code == 3 and f"{MESSAGE} ({why}" in output, output
    assert "Traceback" not in output and "\x1b" not in output
    assert store.load("j1").last_state == "RUNNING"


def test_a_good_status_answer_is_shown(store, monkeypatch, capsys):
    canned_host(monkeypatch, {"status": line({"ok": True, "jobs": [good_job(state="SUCCEEDED")]})})
    code, output = run_cli(capsys, "status", "j1")
    assert code == 0 and "j1: SUCCEEDED" in output
    assert store.load("j1").last_state == "SUCCEEDED"


@pytest.mark.parametrize("verb, argv, answer, why", [
    ("cancel", ("cancel", "j1"), line({"ok": True, "state": ["RUNNING"]}), "cancel: state: expected a job state"),
    ("cancel", ("cancel", "j1"), line({"ok": True}), "cancel: state: missing"),
    ("result", ("results", "j1", "--json"), line({"ok": True, "job_id": "j1"}), "result: result: missing"),
    ("result", ("results", "j1", "--json"), DEEP, "result: answer: nested deeper than"),
    ("cancel", ("cancel", "j1"), line({"ok": False, "error": {"code": 1}}), "cancel: error: expected text"),
    ("cancel", ("cancel", "j1"), line({"ok": False, "error": "busy", "message": ["x"]}),
     "cancel: message: expected text"),
])
def test_other_verbs_refuse_a_bad_answer(store, monkeypatch, capsys, verb, argv, answer, why):
    canned_host(monkeypatch, {verb: answer})
    code, output = run_cli(capsys, *argv)
    assert code == 3 and f"{MESSAGE} ({why}" in output, output
    assert "Traceback" not in output


@pytest.mark.parametrize("answer, why", [
    (line({"ok": True, "state": "broken", "active_state": "active"}), "restore-service: state: expected healthy"),
    (line({"ok": True, "state": "healthy", "log_tail": 7}), "restore-service: log_tail: expected text"),
])
def test_restore_service_refuses_a_bad_answer(monkeypatch, tmp_path, capsys, answer, why):
    monkeypatch.setenv("RUNNER_STATE_DIR", str(tmp_path / "state"))
    canned_host(monkeypatch, {"restore-service": answer})
    code, output = run_cli(capsys, "restore-service", "--host", "local", "--unit", "x.service")
    assert code == 3 and f"{MESSAGE} ({why}" in output, output


REPORT = {"ok": True, "gpus": [{"index": "0", "uuid": "GPU-x", "name": "H200", "total_mib": 143771,
                                "used_mib": 0, "free_mib": 143771}], "apps": [], "service": None,
          "locks": [{"key": "gpu-0", "held": False, "holder": None}], "python": "3.11.7", "nvidia_smi": True}


BAD_REPORTS = [
    ({**REPORT, "gpus": {"0": {}}}, "gpus: expected a list"),
    ({**REPORT, "gpus": [{**REPORT["gpus"][0], "free_mib": "lots"}]}, "gpus.0.free_mib: expected a finite number"),
    ({**REPORT, "locks": [{"key": "gpu-0", "held": "no"}]}, "locks.0.held: expected true or false"),
    ({k: v for k, v in REPORT.items() if k != "locks"}, "locks: missing"),
]


@pytest.mark.parametrize("report, why", BAD_REPORTS)
def test_submit_refuses_a_bad_report_and_stores_nothing_it_said(tmp_path, monkeypatch, capsys, report, why):
    monkeypatch.setenv("RUNNER_STATE_DIR", str(tmp_path / "state"))
    job = tmp_path / "job.yaml"
    job.write_text("name: n\nhost: {address: local}\npayload: {command: ['true']}\ngpu: {devices: [0]}\n")
    canned_host(monkeypatch, {"submit": line({"ok": True, "report": report, "started": True}),
                              "status": line({"ok": True, "jobs": [{"job_id": "hostile-1", "state": "UNKNOWN"}]})})
    code, output = run_cli(capsys, "submit", str(job), "--job-id", "hostile-1")
    # submit's bad answer is taken for a lost one (the controller asks whether the job exists, then submits
    # again): the same report
    assert code == 3 and f"{MESSAGE} (submit: report.{why}" in output, output
    assert_only_the_local_record("hostile-1")


def test_submit_refuses_a_started_answer_of_another_job(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RUNNER_STATE_DIR", str(tmp_path / "state"))
    job = tmp_path / "job.yaml"
    job.write_text("name: n\nhost: {address: local}\npayload: {command: ['true']}\n")
    started = {"ok": True, "report": REPORT, "started": True, "job_id": "other", "state": "RUNNING"}
    canned_host(monkeypatch, {"submit": line(started), "preflight": line(REPORT), "start": line(started),
                              "status": line({"ok": True, "jobs": [{"job_id": "hostile-2", "state": "UNKNOWN"}]})})
    code, output = run_cli(capsys, "submit", str(job), "--job-id", "hostile-2")
    assert code == 3 and f"{MESSAGE} (submit: job_id: not the job asked for" in output, output
    assert_only_the_local_record("hostile-2")


def assert_only_the_local_record(job_id: str) -> None:
    """The job is recorded before the host is asked (a job that may have started stays reachable), and nothing
    of what the host answered is stored in it."""
    records = Store().all()
    assert [(r.job_id, r.last_state, r.cursor) for r in records] == [(job_id, "QUEUED", 0)]


@pytest.mark.parametrize("report, why", BAD_REPORTS)
def test_the_submit_answer_s_report_is_checked(report, why):
    client = HostClient(CannedTransport({"submit": line({"ok": True, "report": report, "started": False})}),
                        root="~/.runner", python="python3", bundle=Bundle({}), deadline=Deadline(30))
    with pytest.raises(TransportError, match=f"submit: report.{why}"):
        client.submit({"job_id": "j1"})


def test_the_error_is_a_transport_error():
    client = HostClient(CannedTransport({"status": line({"ok": True, "jobs": []})}), root="~/.runner",
                        python="python3", bundle=Bundle({}), deadline=Deadline(30))
    with pytest.raises(TransportError, match="status: jobs: 1 asked for, 0 answered"):
        client.status(["j1"])


# -- the forms a real supervisor answers pass (captured shapes of docs/protocol.md) -----------------------

def test_the_host_s_own_forms_pass():
    from runner.remote import answers

    slurm_preflight = {"ok": True, "service": None, "locks": [], "python": "3.8.10", "gpus": [], "apps": [],
                       "nvidia_smi": False, "slurm": {"partitions": ["gpu*"]}}
    assert answers.preflight(slurm_preflight) is slurm_preflight
    started = answers.submit({"ok": True, "report": slurm_preflight, "started": True, "job_id": "a", "state": "QUEUED",
                              "slurm_job_id": "4242", "job_dir": "/r/a"}, "a")
    assert (started.state, started.slurm_job_id) == ("QUEUED", "4242")
    array_job = good_job(job_id="a", state="RUNNING", progress=None,
                         array={"of": 3, "done": 1, "succeeded": 1, "failed": 0, "skipped": 0, "running": 1,
                                "pending": 1, "reasons": {"Priority": 1}},
                         slurm={"job_id": "4242", "state": "RUNNING", "reason": None, "node": "n1",
                                "cuda_visible_devices": "0", "error": None})
    unknown = {"job_id": "b", "state": "UNKNOWN"}
    typed = answers.status({"ok": True, "jobs": [array_job, unknown]}, ["a", "b"])
    assert [job.raw for job in typed] == [array_job, unknown]
    assert (typed[0].state, typed[0].slurm.node, typed[0].array["pending"], typed[1].state) == \
        ("RUNNING", "n1", 1, "UNKNOWN")
    busy = {"ok": False, "error": "busy", "message": "gpu-0 is held by job x (supervisor pid 7)",
            "holder": {"job_id": "x", "pid": 7, "since": 1.0, "key": "gpu-0"}}
    assert answers.failure("start", busy) is busy
    assert answers.result({"ok": True, "job_id": "a", "result": [1, "two", None]}).value == [1, "two", None]
    assert answers.restore_service({"ok": True, "unit": "u.service", "state": "failed", "active_state": "failed",
                                    "sub_state": "failed", "log_tail": "boom"})["state"] == "failed"
    chunk = answers.logs({**good_chunk(b"", offset=0, state="SUCCEEDED"), "size": 0}, 0, 1 << 20)
    assert chunk.data == b"" and chunk.at_end and chunk.terminal
