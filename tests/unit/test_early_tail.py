"""A tail's host call opened before the CLI imports (runner/commands/early_tail.py): taken by the same tail
only, the cursor turn held from before the cursor is read, and nothing decided that the CLI would not."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import time

import pytest

from runner.commands import controller, early_tail
from runner.remote.answers import LogChunk
from runner.state.store import JobRecord, Store


class StreamingHost:
    """A host whose `logs --stream` call is counted when it is opened, and answers one frame."""

    def __init__(self, data: bytes = b"hello\n"):
        self.data, self.opened, self.closed = data, [], 0

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        pass

    def log_stream(self, job_id, offset, **kw):
        self.opened.append((job_id, offset, kw["follow"]))
        host = self

        class Frames:
            def __iter__(self):
                data = host.data[offset:]
                yield LogChunk.from_json({"offset": offset, "next_offset": offset + len(data), "size": len(host.data),
                                          "state": "RUNNING", "terminal": False, "exit_code": None}, data)

            def close(self):
                host.closed += 1

        return Frames()


@pytest.fixture
def store(runner_state_dir):
    s = Store()  # the state dir of RUNNER_STATE_DIR, as the CLI's and early_tail's
    s.save(JobRecord(job_id="j1", name="j", host={"address": "local"}, spec_path="x", submitted_at=time.time()))
    return s


@pytest.fixture
def host(monkeypatch):
    scripted = StreamingHost()
    monkeypatch.setattr(controller, "connect", lambda _h, **_kw: scripted)
    yield scripted
    early_tail.take(early_tail.TailArgs("none"), "")  # nothing left open for the next test


def cli_tail(store, *, follow, max_wait, out):
    """What the CLI's tail does: take what was opened for exactly this tail, hand it to controller.tail."""
    opened = early_tail.take(early_tail.TailArgs("j1", follow, max_wait, False), str(store.root))
    return controller.tail("j1", store=store, out=out, follow=follow, max_wait=max_wait, from_start=False,
                           opened=opened)


@pytest.mark.parametrize("argv, expected", [
    (["tail", "j1"], early_tail.TailArgs("j1")),
    (["tail", "j1", "-f", "--max-wait", "5"], early_tail.TailArgs("j1", follow=True, max_wait=5.0)),
    (["tail", "--max-wait=2.5", "j1", "--json", "--from-start"],
     early_tail.TailArgs("j1", max_wait=2.5, from_start=True)),
    (["tail", "j1", "--follow"], early_tail.TailArgs("j1", follow=True)),
])
def test_the_simple_forms_of_a_tail_are_read(argv, expected):
    assert early_tail.read_argv(argv) == expected


@pytest.mark.parametrize("argv", [
    ["tail"], ["status", "j1"], ["tail", "--help"], ["tail", "j1", "j2"], ["tail", "j1", "--bogus"],
    ["tail", "j1", "-f", "-f"], ["tail", "j1", "--max-wait", "9999"], ["tail", "j1", "--max-wait", "x"],
    ["tail", "j1", "--max-wait", "nan"], ["tail", "j1", "--max-wait"], ["tail", "j1", "--max-wait=1", "--max-wait=2"],
])
def test_anything_else_is_left_to_the_cli(argv):
    assert early_tail.read_argv(argv) is None


def test_the_call_opened_early_is_the_one_the_tail_reads_and_the_turn_is_held_until_it_ends(store, host):
    early_tail.begin(["tail", "j1", "--max-wait", "5"])
    assert host.opened == [("j1", 0, False)]  # opened before any tail asked for it
    with store.cursor_turn("j1", 0.0) as (_record, turn):
        assert turn is False  # held by the opened call: another tail would have to wait
    out = io.BytesIO()
    outcome = cli_tail(store, follow=False, max_wait=5, out=out)
    assert out.getvalue() == b"hello\n" and outcome.offset == 6
    assert host.opened == [("j1", 0, False)] and host.closed == 1  # not opened again; closed once read
    assert store.load("j1").cursor == 6
    with store.cursor_turn("j1", 0.0) as (_record, turn):
        assert turn is True  # released


def test_a_tail_with_other_arguments_closes_the_early_call_and_opens_its_own(store, host):
    early_tail.begin(["tail", "j1", "-f"])
    out = io.BytesIO()
    started = time.monotonic()
    outcome = cli_tail(store, follow=False, max_wait=5, out=out)
    assert time.monotonic() - started < 2.5, "waited for the turn the early call held"
    assert outcome.busy is False and out.getvalue() == b"hello\n"
    assert host.opened == [("j1", 0, True), ("j1", 0, False)] and host.closed == 2


def test_an_early_tail_of_an_unknown_job_opens_nothing_and_raises_nothing(store, host):
    early_tail.begin(["tail", "nope"])
    assert host.opened == [] and early_tail.take(early_tail.TailArgs("nope"), str(store.root)) is None


def test_a_tail_whose_turn_is_held_is_left_to_the_cli(store, host):
    with store.cursor_turn("j1", 0.0) as (_record, turn):
        assert turn
        early_tail.begin(["tail", "j1"])
    assert host.opened == [] and early_tail.take(early_tail.TailArgs("j1"), str(store.root)) is None


def test_the_early_call_is_open_before_click_is_imported(store, tmp_path):
    """`runner tail` opens its host call (here a local host's `logs --stream`) having imported no click."""
    code = ("import json, sys\n"
            "from runner.commands import early_tail\n"
            "early_tail.begin(['tail', 'j1'])\n"
            "opened = early_tail._opened\n"
            "print(json.dumps({'opened': opened is not None, 'click': 'click' in sys.modules}))\n"
            "opened.tail.stack.close()\n")
    store.save(JobRecord(job_id="j1", name="j", host={"address": "local", "root": str(tmp_path / "root")},
                         spec_path="x", submitted_at=time.time()))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "RUNNER_STATE_DIR": str(store.root),
                               "PYTHONPATH": ":".join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"opened": True, "click": False}


def test_the_clis_tail_reads_the_call_opened_before_it(store, host, capsysbinary):
    from runner.cli.cli import main

    early_tail.begin(["tail", "j1", "--max-wait", "5"])
    with pytest.raises(SystemExit) as ended:
        main(["tail", "j1", "--max-wait", "5"])
    assert ended.value.code == 75 and capsysbinary.readouterr().out == b"hello\n"
    assert host.opened == [("j1", 0, False)]  # the CLI's tail did not open a call of its own
