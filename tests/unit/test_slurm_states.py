"""remote_payload/slurm/states.py on real squeue/sacct output captured from the test cluster
(tests/data/slurm/capture.py made every file there; Slurm 22.05)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remote_payload import contract
from remote_payload.slurm import states as slurm_states
from remote_payload.slurm.states import (STATE_MAP, SlurmOutputError, forgotten, parse_sacct, parse_squeue,
                                         reconcile, runner_state, sacct_disabled, squeue_forgot)

DATA = Path(__file__).parents[1] / "data" / "slurm"
# Job ids on the fresh capture cluster, in capture.py's submission order.
TIMEOUT, CANCELLED_RUNNING, NODE_FAIL, REQUEUED, RESOURCES, PRIORITY, SUCCEEDED, FAILED = map(str, range(1, 9))


def squeue(name: str) -> dict:
    return parse_squeue((DATA / f"{name}.squeue.txt").read_text())


def sacct(name: str) -> dict:
    return parse_sacct((DATA / f"{name}.sacct.txt").read_text())


def test_pending_jobs_are_queued_with_slurms_reason():
    early, later = squeue("pending-priority"), squeue("pending-resources")
    assert (early[PRIORITY].state, early[PRIORITY].reason) == ("QUEUED", "Priority")
    assert (early[RESOURCES].state, early[RESOURCES].reason) == ("QUEUED", None)  # not yet looked at
    assert (later[RESOURCES].state, later[RESOURCES].reason) == ("QUEUED", "Resources")
    assert (later[PRIORITY].state, later[PRIORITY].reason) == ("QUEUED", "ReqNodeNotAvail, UnavailableNodes:node1")


def test_running_jobs_are_running_in_squeue_and_sacct():
    for view in (squeue("running"), sacct("running")):
        assert {job.state for job in view.values()} == {"RUNNING"}
        assert {job.reason for job in view.values()} == {None}


def test_a_requeued_job_is_queued_again():
    assert (squeue("requeued")[REQUEUED].state, squeue("requeued")[REQUEUED].reason) == ("QUEUED", "BeginTime")
    recorded = sacct("requeued")[REQUEUED]
    assert (recorded.slurm_state, recorded.state, recorded.reason) == ("REQUEUED", "QUEUED", "requeued by Slurm")


@pytest.mark.parametrize("job, slurm_state, state, exit_code, signal", [
    (SUCCEEDED, "COMPLETED", "SUCCEEDED", 0, 0),
    (RESOURCES, "COMPLETED", "SUCCEEDED", 0, 0),
    (FAILED, "FAILED", "FAILED", 3, 0),
    (TIMEOUT, "TIMEOUT", "TIMED_OUT", 0, 0),
    (CANCELLED_RUNNING, "CANCELLED", "CANCELLED", 0, 0),
    (PRIORITY, "CANCELLED", "CANCELLED", 0, 0),  # cancelled while PENDING
    (REQUEUED, "CANCELLED", "CANCELLED", 0, 0),
    (NODE_FAIL, "NODE_FAIL", "LOST", 0, 0),
])
def test_final_states_from_sacct(job, slurm_state, state, exit_code, signal):
    recorded = sacct("ended")[job]
    assert (recorded.slurm_state, recorded.state, recorded.exit_code, recorded.signal) == (
        slurm_state, state, exit_code, signal)
    assert recorded.source == "sacct"


def test_final_states_agree_between_squeue_and_sacct():
    listed, recorded = squeue("ended"), sacct("ended")
    assert {job: view.state for job, view in listed.items()} == {job: recorded[job].state for job in listed}


def test_final_reasons_are_ours_not_the_last_wait_reason():
    recorded, listed = sacct("ended"), squeue("ended")
    assert recorded[FAILED].reason is None and listed[FAILED].reason is None  # not "NonZeroExitCode"
    assert recorded[NODE_FAIL].reason == "its node failed"


def test_sacct_names_who_cancelled_and_the_state_is_still_cancelled():
    assert "CANCELLED by 0" in (DATA / "ended.sacct.txt").read_text()
    assert sacct("ended")[CANCELLED_RUNNING].slurm_state == "CANCELLED"


def test_squeue_forgot_a_job_means_ask_sacct():
    exit_line, stderr = (DATA / "forgot.squeue.stderr").read_text().split("\n", 1)
    assert squeue_forgot(int(exit_line.split()[-1]), stderr)
    assert not squeue_forgot(0, "")
    assert not squeue_forgot(1, "squeue: error: Unable to contact slurm controller (connect failure)")


def test_sacct_without_accounting_will_never_know_but_an_unreachable_slurmdbd_may_later():
    # the words of Slurm 22.05's sacct on a cluster with AccountingStorageType=accounting_storage/none
    assert sacct_disabled(1, "sacct: error: Slurm accounting storage is disabled\n")
    assert not sacct_disabled(0, "")
    assert not sacct_disabled(1, "sacct: error: Problem talking to the database: Connection refused")


def test_a_job_nobody_knows_is_lost_and_the_message_says_why():
    view = forgotten("42", "Slurm accounting storage is disabled")
    for recorded, started in (("QUEUED", False), ("RUNNING", True)):
        state, message = reconcile(recorded, started, view)
        assert state == "LOST" and message == (
            "neither squeue nor sacct knows Slurm job 42 (squeue forgot it: it ended at least MinJobAge ago; "
            "sacct: Slurm accounting storage is disabled): how it ended is unknown")
    assert reconcile("SUCCEEDED", True, view) == ("SUCCEEDED", None)  # the supervisor's final word stands


def test_every_slurm_state_maps_to_a_runner_state_and_final_ones_to_terminal():
    assert {state for state, _ in STATE_MAP.values()} <= set(contract.STATES)
    final = {"COMPLETED", "FAILED", "OUT_OF_MEMORY", "TIMEOUT", "DEADLINE", "CANCELLED", "NODE_FAIL",
             "BOOT_FAIL", "PREEMPTED", "REVOKED"}
    assert {name for name, (state, _) in STATE_MAP.items() if contract.is_terminal(state)} == final


@pytest.mark.parametrize("text", [
    "1|WEIRD_NEW_STATE|None",          # a state Slurm may add: an error, never a guess
    "1|RUNNING",                       # too few fields
    "|RUNNING|None",                   # no id
])
def test_squeue_output_not_understood_is_an_error(text):
    with pytest.raises(SlurmOutputError):
        parse_squeue(text)


@pytest.mark.parametrize("text", ["1|FAILED|3|None", "1|FAILED|x:0|None", "1|FAILED|3:0"])
def test_sacct_output_not_understood_is_an_error(text):
    with pytest.raises(SlurmOutputError):
        parse_sacct(text)


def test_a_reason_with_a_bar_stays_whole_and_blank_lines_are_skipped():
    parsed = parse_squeue("\n7_3|PENDING|odd|reason\n\n")
    assert (parsed["7_3"].state, parsed["7_3"].reason) == ("QUEUED", "odd|reason")


def test_unknown_state_message_names_it():
    with pytest.raises(SlurmOutputError, match="WEIRD"):
        runner_state("WEIRD")


@pytest.mark.parametrize("name", ["pending-priority", "pending-resources", "running", "requeued", "ended"])
def test_the_text_forms_say_what_the_json_forms_say(name):
    """Captured at the same moment: Slurm 22.05's --json (job_state a string, sacct's state.current) and
    the text forms we parse agree on every job's state and, while it waits, its reason code (the text form
    may add detail after a comma: "ReqNodeNotAvail, UnavailableNodes:node1" is "ReqNodeNotAvail" in JSON)."""
    as_json = json.loads((DATA / f"{name}.squeue.json").read_text())["jobs"]
    listed = squeue(name)
    assert {job: (view.slurm_state, view.reason.split(",")[0] if view.state == "QUEUED" and view.reason else None)
            for job, view in listed.items()} == {
        str(row["job_id"]): (row["job_state"], _waiting_reason(row["job_state"], row["state_reason"]))
        for row in as_json if str(row["job_id"]) in listed}
    recorded = sacct(name)
    as_json = json.loads((DATA / f"{name}.sacct.json").read_text())["jobs"]
    assert {job: view.slurm_state for job, view in recorded.items()} == {
        str(row["job_id"]): row["state"]["current"] for row in as_json}


def _waiting_reason(state: str, reason: str):
    return reason if state == "PENDING" and reason != "None" else None


def test_terminal_states_are_the_contracts():
    assert slurm_states.TERMINAL is contract.TERMINAL  # one definition: the contract's


# ── reconcile: status.json's state + Slurm's view (captured rows) ───────────────────────────────────────

def test_a_final_state_in_status_json_wins_over_slurm():
    assert reconcile("SUCCEEDED", True, sacct("ended")[FAILED]) == ("SUCCEEDED", None)
    assert reconcile("TIMED_OUT", True, squeue("ended")[CANCELLED_RUNNING]) == ("TIMED_OUT", None)


def test_a_waiting_job_shows_slurms_reason():
    assert reconcile("QUEUED", False, squeue("pending-resources")[RESOURCES]) == ("QUEUED", "Resources")
    assert reconcile("QUEUED", False, squeue("running")[TIMEOUT]) == ("QUEUED", "allocated; the supervisor is starting")


def test_a_live_supervisors_progress_is_kept():
    assert reconcile("RUNNING", True, squeue("running")[TIMEOUT]) == ("RUNNING", None)
    assert reconcile("DRAINING", True, squeue("running")[TIMEOUT]) == ("DRAINING", None)
    assert reconcile("RUNNING", True, None) == ("RUNNING", None)  # Slurm does not know it (yet): no verdict


@pytest.mark.parametrize("job, state, words", [
    (PRIORITY, "CANCELLED", "Slurm ended the job: CANCELLED"),      # cancelled before it ever started
    (TIMEOUT, "TIMED_OUT", "Slurm ended the job: TIMEOUT"),
    (NODE_FAIL, "LOST", "NODE_FAIL (its node failed)"),
])
def test_slurm_decides_when_the_supervisor_could_not_write(job, state, words):
    for started in (False, True):
        got_state, message = reconcile("QUEUED" if not started else "RUNNING", started, sacct("ended")[job])
        assert got_state == state and words in message


def test_a_batch_script_that_ended_by_itself_without_a_final_state():
    failed = sacct("ended")[FAILED]
    assert reconcile("QUEUED", False, failed) == (
        "FAILED", "the batch script ended (Slurm: FAILED, exit 3) before the supervisor started; see slurm-8.out")
    assert reconcile("RUNNING", True, sacct("ended")[SUCCEEDED]) == (
        "LOST", "the supervisor ended (Slurm: COMPLETED, exit 0) without writing a final state")


def test_sacct_lists_never_started_array_tasks_as_one_range_and_each_task_is_its_own_view():
    # captured: `--array=0-3%1`, scancel while task 0 ran; sacct compresses the tasks that never started
    jobs = parse_sacct("8_0|CANCELLED by 0|0:0|None\n8_[1-3%1]|CANCELLED by 0|0:0|None\n")
    assert sorted(jobs) == ["8_0", "8_1", "8_2", "8_3"]
    assert {(job.job_id, job.state) for job in jobs.values()} == {(f"8_{k}", "CANCELLED") for k in range(4)}
    assert slurm_states.array_task_ids("8_[0,2-3,7]") == ["8_0", "8_2", "8_3", "8_7"]
    assert slurm_states.array_task_ids("8_5") == ["8_5"] and slurm_states.array_task_ids("9") == ["9"]
    for bad in ("8_[", "8_[3-1]", "8_[a]"):
        with pytest.raises(SlurmOutputError):
            slurm_states.array_task_ids(bad)
