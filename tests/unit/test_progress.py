"""remote_payload.progress: a payload's progress from its event lines, on captured real output."""
from pathlib import Path

import pytest

from remote_payload.progress import describe, parse_event, summarize

RUN2 = Path(__file__).resolve().parents[2] / "results" / "h200" / "run2"


def test_a_real_h200_log_is_summarised_rows_and_last_phase():
    text = (RUN2 / "warm1.log").read_bytes()
    summary = summarize(text)
    rows = sum(1 for line in text.splitlines() if (parse_event(line) or {}).get("event") == "row")
    assert rows >= 10 and summary["rows_done"] == rows
    assert summary["last_t"] > 0 and summary["errors"] == 0


def test_a_cold_compile_in_progress_shows_the_phase_from_its_heartbeats():
    cut = b"".join(line for line in (RUN2 / "cold.log").read_bytes().splitlines(keepends=True)
                   if b'"heartbeat"' in line or b'"jit", "status": "start"' in line)[:2000]
    summary = summarize(cut.rsplit(b"\n", 1)[0])
    assert summary["phase"] in ("import", "jit", "weights") and summary["phase_status"] == "start"


def test_plan_gives_the_rows_expected_and_non_events_are_ignored():
    text = 'hello\n{"event": "plan", "rows": 4, "t": 0.1}\n{"not": "an event"}\n{broken\n{"event": "row", "size": 1, "t": 2}\n'
    summary = summarize(text)
    assert (summary["rows_done"], summary["rows_expected"], summary["last_t"]) == (1, 4, 2)


def test_describe_is_one_short_line():
    line = describe({"event": "phase", "phase": "jit", "status": "start", "m": 1, "t": 20.391})
    assert line == "[   20.4 s] jit start  m=1"
    long = describe({"event": "row", "m": 8, "median_us": 451.234567, "blob": "x" * 500, "t": 3})
    assert "median_us=451.2" in long and len(long) < 140 and "\n" not in long


def test_watch_renders_events_passes_other_lines_and_folds_like_status():
    import io

    from runner.cli.watch import plain_sink, summary_line

    out = io.StringIO()
    sink = plain_sink(out)
    sink.write(b'{"event": "plan", "rows": 2, "t": 0.1}\nplain line\n{"event": "phase", "phase": "jit", ')
    sink.write(b'"status": "start", "t": 1}\n{"event": "row", "m": 1, "t": 2}')  # the last line arrives unterminated
    sink.close()
    assert out.getvalue().splitlines() == ["[    0.1 s] plan  rows=2", "plain line", "[    1.0 s] jit start",
                                           "[    2.0 s] row  m=1"]
    text = '{"event": "plan", "rows": 2, "t": 0.1}\n{"event": "phase", "phase": "jit", "status": "start", "t": 1}\n' \
           '{"event": "row", "m": 1, "t": 2}\n'
    assert sink.summary == summarize(text)
    assert summary_line(sink.summary) == "phase jit start · rows 1/2 · payload clock 2 s"


FAKE_EVENTS = [
    {"event": "variant", "status": "start", "index": "one", "of": [2], "args": "experts=384"},
    {"event": "variant", "status": "start", "index": 1, "of": 2, "args": ["a", "b"]},
    {"event": "variant", "status": ["start"], "index": None},
    {"event": "variant", "status": "skipped", "args": {"k": {"nested": [1, {"x": None}]}}, "index": True},
    {"event": "phase", "phase": {"name": "jit"}, "status": 3, "t": "soon"},
    {"event": "heartbeat", "phase": ["x"], "t": True},
    {"event": "plan", "rows": True},
    {"event": "plan", "rows": -5},
    {"event": "row", "t": float("nan")},
]


@pytest.mark.parametrize("event", FAKE_EVENTS, ids=[str(i) for i in range(len(FAKE_EVENTS))])
def test_any_event_shape_folds_and_renders(event):
    """A payload may print any JSON object with an `event`: the summary keeps only well-typed fields, and
    `runner status` renders it."""
    import json

    from tests.typed_answers import status_text

    summary = summarize(json.dumps(event) + "\n")
    variant = summary.get("variant")
    if variant is not None:
        assert isinstance(variant["args"], dict)
        assert all(variant[k] is None or type(variant[k]) is int for k in ("index", "of"))
    assert summary["phase"] is None or isinstance(summary["phase"], str)
    assert summary["rows_expected"] is None or (type(summary["rows_expected"]) is int and summary["rows_expected"] >= 0)
    text = status_text({"job_id": "j", "state": "RUNNING", "progress": dict(summary, silent_s=1.0)})
    assert text.startswith("j: RUNNING")
    describe(dict(event, t=event.get("t")))
