"""`runner watch` shows a person lines, not megabytes: a line longer than MAX_LINE_BYTES is shown cut, with how
much was left out, never parsed as an event, and costs memory bounded by the cap whatever its length."""
from __future__ import annotations

import time

from runner.cli.watch import MAX_LINE_BYTES, EventSink


def test_a_30_mb_line_is_shown_cut_and_the_next_lines_as_they_are():
    shown: list[str] = []
    sink = EventSink(shown.append)
    chunk = b"x" * (1 << 20)
    started = time.monotonic()
    for _ in range(30):
        sink.write(chunk)
        assert len(sink.partial) <= MAX_LINE_BYTES
    sink.write(b'\n{"event": "row", "m": 1}\nplain\n')
    took = time.monotonic() - started
    assert len(shown) == 3, [s[:80] for s in shown]
    assert len(shown[0]) < MAX_LINE_BYTES + 200 and f"{30 * (1 << 20) - MAX_LINE_BYTES} more bytes" in shown[0]
    assert "row" in shown[1] and shown[2] == "plain"
    assert sink.summary["rows_done"] == 1
    assert took < 10, took  # generous: proves it does not block


def test_a_long_event_line_is_not_parsed():
    shown: list[str] = []
    sink = EventSink(shown.append)
    sink.write(b'{"event": "row", "pad": "' + b"y" * (2 * MAX_LINE_BYTES) + b'"}\n')
    assert sink.summary["rows_done"] == 0 and "more bytes of this line not shown" in shown[0]


def test_short_lines_split_across_writes_are_whole():
    shown: list[str] = []
    sink = EventSink(shown.append)
    for piece in (b"ab", b"c\nde", b"f\n", b"g"):
        sink.write(piece)
    sink.close()
    assert shown == ["abc", "def", "g"]
