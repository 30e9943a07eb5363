"""`runner status`'s text for a person: the payload line says where the payload is, not where it was."""
from runner.cli.cli import _status_text


def _job(progress: dict) -> dict:
    return {"job_id": "j1", "state": "RUNNING", "created_at": 100.0, "now": 160.0,
            "progress": {"rows_done": 0, "rows_expected": None, "silent_s": 1.0, **progress}}


def test_a_phase_that_ended_is_not_shown_as_the_current_one():
    text = _status_text(_job({"phase": "compile", "phase_status": "end", "rows_done": 3, "rows_expected": 10}))
    assert "phase compile ended, rows 3 of 10" in text


def test_a_running_phase_is_shown_as_it_is():
    text = _status_text(_job({"phase": "compile", "phase_status": "start"}))
    assert "phase compile, rows 0" in text


def test_a_failed_phase_says_so():
    text = _status_text(_job({"phase": "jit", "phase_status": "error"}))
    assert "phase jit failed" in text
