"""What status and watch say of a sweep whose variants run side by side or one after another (the sweep's rows
and its variants', never past its plan), and of a queued job (never `None`), from the progress the host's log
gives: pure functions on the log lines as the host writes them.
"""
from __future__ import annotations

import json

from remote_payload.progress import summarize
from runner.cli.watch import summary_line
from runner.fleet.fleet_view import HostRow, _host_line
from runner.remote.job_answers import JobStatus
from tests.typed_answers import status_text as _status_text


def _variant(index: int, status: str, slot: int, of: int = 4) -> str:
    return json.dumps({"index": index, "of": of, "args": {"seconds": index}, "status": status, "slot": slot,
                       "devices": [str(slot)], "event": "variant"})


PLAN, ROW = '{"event": "plan", "rows": 2}', '{"event": "row", "m": 1}'
# 4 variants over 2 slots, each planning 2 rows, their lines interleaved in the one log as the host writes them
SIDE_BY_SIDE = [_variant(1, "start", 0), _variant(2, "start", 1), PLAN, PLAN, ROW, ROW, ROW,
                _variant(1, "end", 0), _variant(3, "start", 0), PLAN, ROW, _variant(2, "end", 1),
                _variant(4, "start", 1), PLAN, ROW]


def _running(progress: dict) -> dict:
    return {"job_id": "j1", "state": "RUNNING", "created_at": 100.0, "now": 160.0,
            "progress": dict(progress, silent_s=1.0)}


def test_side_by_side_rows_count_for_the_sweep_and_never_pass_its_plan():
    for upto in range(1, len(SIDE_BY_SIDE) + 1):
        summary = summarize("\n".join(SIDE_BY_SIDE[:upto]))
        if summary["rows_expected"] is not None:
            assert summary["rows_done"] <= summary["rows_expected"], (upto, summary)
    summary = summarize("\n".join(SIDE_BY_SIDE))
    assert (summary["rows_done"], summary["rows_expected"]) == (5, 8)
    sweep = summary["sweep"]
    assert (sweep["done"], sweep["of"], sweep["running"], sweep["side_by_side"]) == (2, 4, [3, 4], True)


def test_status_of_a_side_by_side_sweep_says_the_sweeps_rows_and_its_variants():
    text = _status_text(_running(summarize("\n".join(SIDE_BY_SIDE))))
    assert "rows 5 of 8 (the sweep's: its variants run side by side)" in text, text
    assert "2 of 4 variants done, running 3, 4, rows 5 of 8 in all" in text, text


def test_a_sequential_sweep_shows_the_variants_rows_and_the_sweeps_total():
    lines = [_variant(1, "start", 0, of=2), PLAN, ROW, ROW, _variant(1, "end", 0, of=2),
             _variant(2, "start", 0, of=2), PLAN, ROW]
    summary = summarize("\n".join(lines))
    assert (summary["rows_done"], summary["rows_expected"]) == (1, 2)
    text = _status_text(_running(summary))
    assert "rows 1 of 2," in text and "variant 2 of 2: seconds=2; the sweep: 1 of 2 variants done, running 2, " \
                                       "rows 3 of 4 in all" in text, text


def test_watch_line_of_a_side_by_side_sweep():
    line = summary_line(summarize("\n".join(SIDE_BY_SIDE)))
    assert "rows 5/8 (the sweep's) · variants 2/4 done" in line, line


def test_status_of_a_queued_job_never_prints_none():
    job = {"job_id": "j1", "state": "QUEUED", "phase": "waiting for the host lock", "created_at": 100.0, "now": 160.0,
           "service": {"manager": "systemd", "unit": "fake-llm.service", "was": None, "now": None, "stopped": False}}
    text = _status_text(job)
    assert "None" not in text, text
    assert "service     fake-llm.service not touched yet" in text, text
    half = dict(job, state="RUNNING", service=dict(job["service"], was="active", now=None))
    assert "None" not in _status_text(half) and "was active now ?" in _status_text(half)


def test_fleet_status_of_a_queued_host_never_prints_none():
    job = {"job_id": "r.1", "state": "QUEUED", "service": {"unit": "fake-llm.service", "was": None, "now": None}}
    line = _host_line(HostRow("box-a", "r.1", "started", "", None, 75, JobStatus.from_json(job)))
    assert "None" not in line and "service not touched yet" in line, line
