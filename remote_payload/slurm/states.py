"""Slurm's view of a job, as runner's job states. Pure parsers of squeue/sacct output; stdlib only, no I/O.

The parsable text forms, not `--json`: their fields have been the same from Slurm 17 to 24, while the JSON's
shape changed twice; a login node may run any of them.

    squeue -h -t all -j IDS -o '%i|%T|%r'            job id | long state | reason  (known to slurmctld)
    sacct -n -P -X -j IDS -o JobID,State,ExitCode,Reason                            (accounting, any age)

Ask squeue first: it is immediate, while sacct is eventually consistent. A job slurmctld has forgotten
(MinJobAge after its end) makes `squeue -j` fail (`squeue_forgot`); then sacct has the final record. Where
sacct has none either (no accounting, or no row), `forgotten` makes it LOST rather than leaving it
QUEUED/RUNNING for ever. A requeued job is QUEUED in both; PREEMPTED is seen only when it is final.

The reason shown is Slurm's only while the job waits: for other states squeue repeats the state in other
words and sacct keeps the last reason the job waited for, which would mislead. Otherwise it is our note for
states that runner's name alone does not say (OUT_OF_MEMORY → FAILED "out of memory"). Every state of
`man squeue` is mapped below; anything else is an error, never a guess.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..contract import TERMINAL

SQUEUE_FORMAT = "%i|%T|%r"
SACCT_FIELDS = "JobID,State,ExitCode,Reason"
SQUEUE_FORGOT = "Invalid job id specified"
SACCT_DISABLED = "accounting storage is disabled"
ARRAY_RANGE = re.compile(r"([0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*)(?:%[0-9]+)?\]")  # "1,3-5%2]"

# Slurm job state → (runner state, why, when runner's state alone does not say it)
STATE_MAP = {
    "PENDING": ("QUEUED", None),
    "CONFIGURING": ("QUEUED", "allocated, nodes are being readied"),
    "REQUEUED": ("QUEUED", "requeued by Slurm"),
    "REQUEUE_HOLD": ("QUEUED", "requeued and held"),
    "REQUEUE_FED": ("QUEUED", "requeued by the federation"),
    "SPECIAL_EXIT": ("QUEUED", "requeued and held (special exit)"),
    "RESV_DEL_HOLD": ("QUEUED", "held: its reservation was deleted"),
    "RUNNING": ("RUNNING", None),
    "RESIZING": ("RUNNING", "being resized"),
    "SIGNALING": ("RUNNING", "being signalled"),
    "SUSPENDED": ("RUNNING", "suspended by Slurm (its time limit pauses)"),
    "STOPPED": ("RUNNING", "stopped by SIGSTOP, allocation kept"),
    "COMPLETING": ("TERMINATING", "processes ending, epilog running"),
    "STAGE_OUT": ("TERMINATING", "staging out files"),
    "COMPLETED": ("SUCCEEDED", None),
    "FAILED": ("FAILED", None),
    "OUT_OF_MEMORY": ("FAILED", "out of memory"),
    "TIMEOUT": ("TIMED_OUT", None),
    "DEADLINE": ("TIMED_OUT", "reached its --deadline"),
    "CANCELLED": ("CANCELLED", None),
    "NODE_FAIL": ("LOST", "its node failed"),
    "BOOT_FAIL": ("LOST", "its node failed to boot"),
    "PREEMPTED": ("LOST", "preempted by Slurm and not requeued"),
    "REVOKED": ("LOST", "revoked: a sibling cluster of the federation runs it"),
}


class SlurmOutputError(ValueError):
    """squeue/sacct printed something these parsers do not understand; the message quotes it."""


@dataclass(frozen=True)
class SlurmJob:
    job_id: str                 # Slurm's id as printed ("123", array task "123_4")
    slurm_state: str            # "PENDING", "CANCELLED", … (sacct's "CANCELLED by 0" → "CANCELLED")
    state: str                  # runner's state (contract.STATES)
    reason: str | None       # Slurm's reason ("Resources", "Priority", …) or our note; None when nothing
    exit_code: int | None = None  # sacct only: the batch script's exit status
    signal: int | None = None     # sacct only: the signal that ended it, 0 when none
    source: str = "squeue"      # "squeue" or "sacct"; "none" when neither knows the job (`forgotten`)


def runner_state(slurm_state: str) -> tuple[str, str | None]:
    """(runner state, note) for one Slurm job state; SlurmOutputError for a state not in Slurm's list."""
    try:
        return STATE_MAP[slurm_state]
    except KeyError:
        raise SlurmOutputError("unknown Slurm job state %r" % slurm_state) from None


def parse_squeue(text: str) -> dict:
    """Lines of `squeue -h -o '%i|%T|%r'` → {job_id: SlurmJob}."""
    jobs = {}
    for fields in _rows(text, 3, "squeue"):
        job_id, slurm_state, reason = fields
        jobs[job_id] = _job(job_id, slurm_state, reason, "squeue")
    return jobs


def parse_sacct(text: str) -> dict:
    """Lines of `sacct -n -P -X -o JobID,State,ExitCode,Reason` → {job_id: SlurmJob}."""
    jobs = {}
    for fields in _rows(text, 4, "sacct"):
        job_id, state_text, exit_text, reason = fields
        # sacct adds who cancelled: "CANCELLED by 0"
        slurm_state = state_text.split(" by ", 1)[0]
        exit_code, signal = _exit_code(exit_text)
        for task_id in array_task_ids(job_id):  # array tasks that never started share one row
            jobs[task_id] = _job(task_id, slurm_state, reason, "sacct", exit_code, signal)
    return jobs


def array_task_ids(job_id: str) -> list:
    """sacct's JobID as the ids it stands for: "8_[1,3-5%2]" (the tasks of an array that never started, in
    one row) → ["8_1", "8_3", "8_4", "8_5"]; any other id ("8_4", "123") as it is."""
    head, sep, tasks = job_id.partition("_[")
    if not sep:
        return [job_id]
    match = ARRAY_RANGE.fullmatch(tasks)
    if not head.isdigit() or match is None:
        raise SlurmOutputError("sacct array job id not understood: %r" % job_id)
    ids = []
    for part in match.group(1).split(","):
        first, _, last = part.partition("-")
        low, high = int(first), int(last or first)
        if high < low:
            raise SlurmOutputError("sacct array job id not understood: %r" % job_id)
        ids += ["%s_%d" % (head, k) for k in range(low, high + 1)]
    return ids


def squeue_forgot(returncode: int, stderr: str) -> bool:
    """True when `squeue -j ID` failed only because slurmctld no longer knows the job (ask sacct)."""
    return returncode != 0 and SQUEUE_FORGOT in stderr


def sacct_disabled(returncode: int, stderr: str) -> bool:
    """True when sacct failed because the cluster keeps no accounting: it will never know the job."""
    return returncode != 0 and SACCT_DISABLED in stderr


def forgotten(job_id: str, sacct_said: str) -> SlurmJob:
    """The view of a job squeue forgot and sacct has no record of (`sacct_said`: why, in sacct's words)."""
    return SlurmJob(job_id=job_id, slurm_state="", state="LOST", reason="sacct: " + sacct_said, source="none")


def _job(job_id: str, slurm_state: str, reason: str, source: str, exit_code=None, signal=None) -> SlurmJob:
    state, note = runner_state(slurm_state)
    told = reason if state == "QUEUED" and reason not in ("", "None") else None
    return SlurmJob(job_id=job_id, slurm_state=slurm_state, state=state, reason=told or note,
                    exit_code=exit_code, signal=signal, source=source)


def _rows(text: str, width: int, tool: str):
    """Split each non-empty line on '|' into `width` fields; the last field (a reason) keeps any extra '|'."""
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split("|", width - 1)
        if len(fields) != width or not fields[0] or not fields[1]:
            raise SlurmOutputError("%s line has not %d '|'-separated fields: %r" % (tool, width, line))
        yield fields


def _exit_code(text: str) -> tuple:
    """sacct's ExitCode "3:0" → (3, 0): the exit status, then the signal that ended the job."""
    code, sep, signal = text.partition(":")
    if not sep or not code.isdigit() or not signal.isdigit():
        raise SlurmOutputError("sacct ExitCode is not STATUS:SIGNAL: %r" % text)
    return int(code), int(signal)


def reconcile(recorded: str, supervisor_started: bool, slurm: SlurmJob | None) -> tuple:
    """(state, message) of a Slurm job from the state its status.json records and Slurm's view of it.

    Slurm's state stands in for the supervisor's liveness (its pid is on a compute node). status.json stays the
    authority while it can be; Slurm decides only what the supervisor could not write. Call with status.json
    read again *after* Slurm's answer, so that a supervisor that finished in between is not taken for a lost
    one. message is None when status.json says all.
    """
    if recorded in TERMINAL or slurm is None:
        return recorded, None
    if slurm.source == "none":
        return "LOST", ("neither squeue nor sacct knows Slurm job %s (squeue forgot it: it ended at least "
                        "MinJobAge ago; %s): how it ended is unknown" % (slurm.job_id, slurm.reason))
    if slurm.state not in TERMINAL:
        if recorded == "QUEUED" and slurm.state == "QUEUED":
            return "QUEUED", slurm.reason
        if recorded == "QUEUED" and not supervisor_started:
            return "QUEUED", "allocated; the supervisor is starting"
        return recorded, None
    if slurm.state in ("CANCELLED", "TIMED_OUT", "LOST"):
        return slurm.state, "Slurm ended the job: %s%s" % (slurm.slurm_state,
                                                           " (%s)" % slurm.reason if slurm.reason else "")
    ended = "Slurm: %s, exit %s" % (slurm.slurm_state, slurm.exit_code)
    if not supervisor_started:
        return "FAILED", "the batch script ended (%s) before the supervisor started; see slurm-%s.out" % (
            ended, slurm.job_id)
    return "LOST", "the supervisor ended (%s) without writing a final state" % ended

