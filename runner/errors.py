"""The one error tree of runner, and every exit status runner uses. `cli.py` is the only place that turns
these into messages and process exits (`cli.exit_code` for outcomes that are not errors).

    RunnerError                      exit 1 unless a subclass says otherwise
    ├── SpecError                    2  bad job spec or bad command-line usage
    ├── TransportError               3  host unreachable, auth failed, timed out
    │   ├── HostKeyError             3  unknown or changed host key (message has the fingerprint)
    │   └── BadAnswer                3  the host answered outside the wire contract (runner/answers.py)
    ├── PreflightError               4  the host cannot run this job now (memory, service policy)
    ├── HostBusy                     5  a lock is held; the message names the holder
    ├── SchedulerUnavailable         3  launcher slurm: no sbatch/squeue on the login node, slurmctld silent
    ├── RemoteError                  1  the supervisor answered an error
    │   └── UnknownJob               2  no such job id on the host or in the local index
    ├── NoResult                     1  the job wrote no result.json
    ├── LocalStateError              2  the controller's state dir cannot be read or written
    └── BadBaseline                  2  a regression-gate baseline file that cannot be used
"""
from __future__ import annotations

EXIT_OK = 0             # done, accepted, SUCCEEDED, healthy
EXIT_FAILED = 1         # the job ended other than SUCCEEDED, no result, the service failed to come back
EXIT_USAGE = 2          # bad spec or usage, unknown job id
EXIT_UNREACHABLE = 3    # host unreachable, auth failed, host key unknown or changed
EXIT_REFUSED = 4        # preflight refused
EXIT_BUSY = 5           # a lock is held by another job
EXIT_STILL_RUNNING = 75  # still running / still starting: call again (EX_TEMPFAIL)
EXIT_ABORTED = 130      # interrupted (Ctrl-C)


class RunnerError(Exception):
    exit_code = EXIT_FAILED
    hint = ""

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        if hint:
            self.hint = hint


class SpecError(RunnerError):
    exit_code = EXIT_USAGE


class TransportError(RunnerError):
    exit_code = EXIT_UNREACHABLE


class HostKeyError(TransportError):
    pass


class BadAnswer(TransportError):
    """The host's answer breaks the wire contract (a broken or compromised supervisor): nothing of it is used."""


class PreflightError(RunnerError):
    exit_code = EXIT_REFUSED


class HostBusy(RunnerError):
    exit_code = EXIT_BUSY


class SchedulerUnavailable(RunnerError):
    """Slurm cannot be used from the login node (not a lost link: never retried)."""

    exit_code = EXIT_UNREACHABLE


class RemoteError(RunnerError):
    def __init__(self, message: str, *, code: str = "internal", answer: dict | None = None, hint: str = "") -> None:
        super().__init__(message, hint=hint)
        self.code = code
        self.answer = answer or {}


class UnknownJob(RemoteError):
    exit_code = EXIT_USAGE


class NoResult(RunnerError):
    pass


class LocalStateError(RunnerError):
    """The controller's own state dir ($RUNNER_STATE_DIR) cannot be written or read: checked before any host."""

    exit_code = EXIT_USAGE


class BadBaseline(RunnerError):
    """A regression-gate baseline file that cannot be used (runner/gate.py)."""

    exit_code = 2
