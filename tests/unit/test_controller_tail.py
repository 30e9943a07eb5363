"""controller.tail's bookkeeping, against a scripted host (no transport): what was printed stays printed."""
from __future__ import annotations

import io
import time

import pytest

from runner.commands import controller
from runner.errors import RemoteError, TransportError
from runner.remote.answers import LogChunk
from runner.state.store import JobRecord, Store


class ScriptedHost:
    """Answers `logs` from a list; an exception in the list is raised at that call."""

    def __init__(self, answers):
        self.answers = list(answers)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        pass

    def logs(self, job_id, offset, **_kw):
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return LogChunk.from_json(dict(answer, offset=offset), answer["data"])



def chunk(data: bytes, start: int, size: int, state="RUNNING"):
    return {"data": data, "next_offset": start + len(data), "size": size, "state": state,
            "terminal": state != "RUNNING", "exit_code": None}


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path)
    s.save(JobRecord(job_id="j1", name="j", host={"address": "local"}, spec_path="x", submitted_at=time.time()))
    return s


def test_bytes_printed_before_a_failed_round_trip_are_kept(store, monkeypatch):
    host = ScriptedHost([chunk(b"hello\n", 0, 12), TransportError("link lost")])
    monkeypatch.setattr(controller, "connect", lambda _h, **_kw: host)
    out = io.BytesIO()
    outcome = controller.tail("j1", store=store, out=out, follow=True, max_wait=5, from_start=False)
    assert out.getvalue() == b"hello\n" and outcome.terminal is False  # exit 75: call again
    assert store.load("j1").cursor == 6


def test_a_failed_first_round_trip_is_an_error(store, monkeypatch):
    monkeypatch.setattr(controller, "connect", lambda _h, **_kw: ScriptedHost([TransportError("link lost")]))
    with pytest.raises(TransportError):
        controller.tail("j1", store=store, out=io.BytesIO(), follow=True, max_wait=5, from_start=False)


def test_status_never_rolls_back_a_cursor_saved_meanwhile(store):
    stale = store.load("j1")
    fresh = store.load("j1")
    fresh.cursor = 5000
    store.save(fresh)  # a tail saved its cursor while a status call was in flight
    store.update_state(stale.job_id, "SUCCEEDED")
    assert (store.load("j1").cursor, store.load("j1").last_state) == (5000, "SUCCEEDED")


def test_the_cursor_moves_only_after_the_caller_delivered(store, monkeypatch):
    monkeypatch.setattr(controller, "connect", lambda _h, **_kw: ScriptedHost([chunk(b"hello\n", 0, 6, "SUCCEEDED")]))
    seen = []

    def delivered(outcome):
        seen.append(store.load("j1").cursor)
        raise BrokenPipeError  # the caller could not hand the bytes on: it did not end by itself

    with pytest.raises(BrokenPipeError):
        controller.tail("j1", store=store, out=io.BytesIO(), follow=False, max_wait=5, from_start=False,
                        delivered=delivered)
    assert seen == [0] and store.load("j1").cursor == 0


def test_a_host_error_after_printing_ends_the_call_and_keeps_the_bytes(store, monkeypatch):
    host = ScriptedHost([chunk(b"hello\n", 0, 12), RemoteError("logs: boom", code="internal")])
    monkeypatch.setattr(controller, "connect", lambda _h, **_kw: host)
    outcome = controller.tail("j1", store=store, out=io.BytesIO(), follow=True, max_wait=5, from_start=False)
    assert (outcome.terminal, outcome.printed, store.load("j1").cursor) == (False, 6, 6)


def test_a_tail_that_cannot_get_the_turn_prints_nothing_and_says_busy(store, monkeypatch):
    monkeypatch.setattr(controller, "connect", lambda _h, **_kw: ScriptedHost([chunk(b"hello\n", 0, 6)]))
    out = io.BytesIO()
    with store.cursor_turn("j1", 0) as (_record, held):
        assert held
        outcome = controller.tail("j1", store=store, out=out, follow=True, max_wait=0.3, from_start=False)
    assert outcome.busy and not outcome.terminal and out.getvalue() == b"" and store.load("j1").cursor == 0


def test_a_stale_record_saved_never_moves_the_cursor_back(store):
    stale = store.load("j1")
    store.advance_cursor("j1", 700, "RUNNING")
    stale.last_state = "SUCCEEDED"
    store.save(stale)
    assert store.load("j1").cursor == 700
    store.advance_cursor("j1", 300, "RUNNING")  # a --from-start call that ended earlier in the log
    assert store.load("j1").cursor == 700
