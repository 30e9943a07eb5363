"""How long `runner watch` follows a job: on a terminal until the job ends unless told otherwise, else
--max-wait; when it runs out of time it says the job is still running and how to go on (exit 75).
"""
from __future__ import annotations

from runner.cli.cli import WATCH_UNTIL_END, watch_bound
from runner.deadline import DEFAULT_MAX_WAIT_S
from tests.cli_helpers import local_target, run_cli, submit, write_job


def test_watch_that_runs_out_of_time_says_the_job_is_still_running(work):
    target = local_target({"RUNNER_STATE_DIR": str(work / "state")})
    job_id = submit(target, write_job(work / "sleep.yaml", target, command=["sleep", "30"]))
    try:
        done = run_cli(target, "watch", job_id, "--plain", "--max-wait", "1")
        assert done.returncode == 75, done
        assert f"{job_id} still running; `runner watch {job_id}` again to go on".encode() in done.stderr, done.stderr
    finally:
        run_cli(target, "cancel", job_id)


def test_watch_on_a_terminal_follows_until_the_job_ends_unless_told_otherwise():
    assert watch_bound(None, on_terminal=True) == WATCH_UNTIL_END >= 86400
    assert watch_bound(None, on_terminal=False) == DEFAULT_MAX_WAIT_S
    assert watch_bound(20.0, on_terminal=True) == 20.0
