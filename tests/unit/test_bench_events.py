"""Event lines: one flushed JSON object per line, phase start/end, heartbeats while a phase runs long."""
import io
import json
import time

import pytest

from remote_payload.payloads.marlin_moe.marlin_events import Events


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_slow_phase_gets_heartbeats_between_start_and_end():
    out = io.StringIO()
    events = Events(time.time(), out, heartbeat_s=0.1)
    with events.phase("jit", m=1):
        time.sleep(0.55)  # the slow phase itself: long enough for several 0.1 s heartbeats
    got = lines(out)
    assert got[0] == {"event": "phase", "phase": "jit", "status": "start", "m": 1, "t": got[0]["t"]}
    beats = [e for e in got if e["event"] == "heartbeat"]
    assert len(beats) >= 3
    assert all(b["phase"] == "jit" and b["elapsed_s"] > 0 for b in beats)
    assert got[-1]["status"] == "end" and got[-1]["seconds"] >= 0.5
    assert events.phase_seconds["jit"] == got[-1]["seconds"]


def test_a_quick_phase_has_no_heartbeat():
    out = io.StringIO()
    events = Events(time.time(), out, heartbeat_s=5)
    with events.phase("weights"):
        pass
    assert [e["event"] for e in lines(out)] == ["phase", "phase"]


def test_a_failing_phase_ends_with_status_error_and_stops_beating():
    out = io.StringIO()
    events = Events(time.time(), out, heartbeat_s=0.05)
    with pytest.raises(RuntimeError):
        with events.phase("import"):
            raise RuntimeError("boom")
    count = len(lines(out))
    time.sleep(0.2)  # a window of four heartbeat periods in which a beat that went on would be written
    assert len(lines(out)) == count
    assert lines(out)[-1]["status"] == "error"


def test_times_count_from_process_start():
    out = io.StringIO()
    Events(time.time() - 7.0, out).emit("row", m=1)
    assert lines(out)[0]["t"] >= 7.0
