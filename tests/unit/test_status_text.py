"""`runner status`'s text for a person: the payload line says where the payload is, not where it was."""
from tests.typed_answers import status_text as _status_text


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


def test_the_window_says_what_became_of_the_engines_requests_in_status_and_results():
    from runner.commands.render import window_lines as _window_lines
    window = {"method": "sglang", "not_serving_s": 10.0, "release_s": 0.4, "payload_s": 8.5, "pause_mode": "drain",
              "clients": {"at_pause": 0, "held": 0, "aborted": 0, "truncated": 0, "refused": 0, "drained_s": 2.0,
                          "gate_pauses": 1, "hold_s": 9.1}}
    job = dict(_job({}), state="SUCCEEDED", service={"unit": "sglang.service", "was": "active", "now": "active",
                                                     "downtime_s": 10.0, "downtime": window})
    drained = ("clients (drain): 0 in flight at the pause: 0 held, 0 aborted, 0 truncated, 0 refused (drained in "
               "2.0 s while serving, 1 gate pause(s)); held 9.1 s")
    assert drained in _status_text(job)
    assert _window_lines(window) == ["service window (sglang): not serving 10.0 s (release 0.4, payload 8.5 s); "
                                     + drained]
    retract = dict(window, pause_mode="retract", clients={"at_pause": 4, "held": 4, "aborted": 0, "truncated": 0,
                                                          "refused": 0, "hold_s": 9.9})
    assert _window_lines(retract)[0].endswith("clients (retract): 4 in flight at the pause: 4 held, 0 aborted, "
                                              "0 truncated, 0 refused; held 9.9 s")
    vllm = {"method": "vllm", "not_serving_s": 9.0, "clients": {"at_pause": 3, "completed": 3, "held": 0}}
    assert _window_lines(vllm)[0].endswith("clients (vllm): 3 in flight at the pause: 0 held, 3 completed")
    assert "clients" not in _window_lines({"method": "stop", "not_serving_s": 70.0})[0]


def test_a_job_on_slurm_says_where_the_scheduler_has_it():
    slurm = {"job_id": "4242", "state": "PENDING", "reason": "Priority", "node": None, "cuda_visible_devices": None}
    text = _status_text(dict(_job({}), state="QUEUED", slurm=slurm))
    assert "  scheduler   slurm 4242 PENDING (Priority)\n" in text + "\n" and " on " not in text
    running = _status_text(dict(_job({}), slurm=dict(slurm, state="RUNNING", reason=None, node="n1")))
    assert "  scheduler   slurm 4242 RUNNING on n1" in running
    array = {"of": 3, "done": 1, "succeeded": 1, "failed": 0, "skipped": 0, "running": 1, "pending": 1,
             "reasons": {"Priority": 1}}
    swept = _status_text(dict(_job({}), slurm=slurm, array=array))
    assert ("  array       slurm 4242: 1 of 3 done (1 succeeded, 0 failed, 0 skipped), 1 running, 1 pending "
            "(Priority)") in swept and "scheduler" not in swept
