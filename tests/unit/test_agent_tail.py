"""unattended.tail_text (the MCP `tail`), against a scripted host that serves a log in small chunks (no transport).

What matters: the texts of successive calls join to the log exactly, whatever the chunk boundaries cut.
"""
from __future__ import annotations

import time

import pytest

from runner.commands import controller, unattended
from runner.remote.answers import LogChunk
from runner.state.store import JobRecord, Store

LOG = "start é ü € 𝄞 done\n".encode() + b"raw \xff\xfe bytes\n" + "end ✓\n".encode()


class ChunkedHost:
    """A log that grows by `step` bytes per `logs` call; terminal once all is written and `ends_after` calls passed."""

    def __init__(self, step: int, ends_after: int = 0):
        self.step, self.ends_after, self.calls = step, ends_after, 0
        self.transport = self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def logs(self, job_id, offset, *, max_bytes, wait):
        self.calls += 1
        written = min(len(LOG), self.calls * self.step)
        data = LOG[offset:min(written, offset + max_bytes)]
        terminal = written == len(LOG) and self.calls > self.ends_after
        return LogChunk(offset, offset + len(data), len(LOG), data, "SUCCEEDED" if terminal else "RUNNING",
                        terminal, 0 if terminal else None)

    def close(self):
        pass


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path)
    s.save(JobRecord(job_id="j1", name="j", host={"address": "local"}, spec_path="x", submitted_at=time.time()))
    return s


@pytest.mark.parametrize("step", [1, 2, 3, 5, 7, len(LOG)])
def test_texts_join_to_the_log_exactly_whatever_the_chunk_size(store, monkeypatch, step):
    host = ChunkedHost(step)
    monkeypatch.setattr(controller, "connect", lambda _h, **_kw: host)
    texts, answer = [], None
    for _ in range(3 * len(LOG)):
        answer = unattended.tail_text("j1", store=store, max_wait=1, max_bytes=1024)
        texts.append(answer.text)
        if not answer.call_again:
            break
    joined = "".join(texts)
    assert joined.encode("utf-8", "backslashreplace").replace(b"\\xff\\xfe", b"\xff\xfe") == LOG
    assert "\\xff\\xfe" in joined and "𝄞" in joined and answer.state == "SUCCEEDED"
    assert store.load("j1").cursor == len(LOG)


def test_a_running_job_with_a_partial_character_holds_it_back(store, monkeypatch):
    cut = LOG.index("€".encode()) + 1  # one byte into the three of €
    host = ChunkedHost(cut, ends_after=10)
    monkeypatch.setattr(controller, "connect", lambda _h, **_kw: host)
    first = unattended.tail_text("j1", store=store, max_wait=1, max_bytes=1024)
    assert first.text == "start é ü " and first.call_again and store.load("j1").cursor == cut - 1
    started = time.monotonic()
    second = unattended.tail_text("j1", store=store, max_wait=5, max_bytes=1024)  # the rest of € has arrived meanwhile
    assert second.text.startswith("€ 𝄞") and host.calls == 2 and time.monotonic() - started < 1


def test_max_bytes_bounds_one_call(store, monkeypatch):
    monkeypatch.setattr(controller, "connect", lambda _h, **_kw: ChunkedHost(len(LOG), ends_after=10))
    answer = unattended.tail_text("j1", store=store, max_wait=1, max_bytes=6)
    assert answer.text == "start " and answer.call_again and answer.offset == 6


def test_a_max_bytes_smaller_than_a_character_still_moves_on(store, monkeypatch):
    monkeypatch.setattr(controller, "connect", lambda _h, **_kw: ChunkedHost(len(LOG)))
    texts = []
    for _ in range(2 * len(LOG)):
        answer = unattended.tail_text("j1", store=store, max_wait=1, max_bytes=1)
        texts.append(answer.text)
        if not answer.call_again:
            break
    assert "".join(texts).startswith("start é ü € 𝄞 done\n") and store.load("j1").cursor == len(LOG)
