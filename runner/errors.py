"""The one error tree of runner, every exit status runner uses, and the stable error codes. `cli.py` is the
only place that turns these into messages and process exits; `exit_code` and `worst` below are the one table
from an outcome that is not an error (a job state, a service state) to an exit status.

Each class has a `code`: the kebab-case name that `--json` errors (`{"error": CODE, …}`) and MCP tool errors
carry, the same word the host's wire answers use where one exists (remote_payload/contract.py ERRORS). Codes
are a contract; class names are not. A RemoteError carries the wire's own code for what the host answered.

    class                   exit  code                what
    RunnerError             1     internal            anything else; the message says what
    ├── SpecError           2     bad-spec            bad job spec or bad command-line usage
    ├── TransportError      3     host-unreachable    host unreachable, link lost, timed out (retried: idempotent calls)
    │   ├── HostKeyError    3     host-key            unknown or changed host key (message has the fingerprint)
    │   ├── AuthFailed      3     auth-failed         the login was refused (never retried: retries lock accounts)
    │   └── BadAnswer       3     bad-answer          the host answered outside the wire contract (remote/answers.py)
    ├── PreflightError      4     preflight-refused   the host cannot run this job now (memory, service policy)
    ├── HostBusy            5     busy                a lock is held; the message names the holder
    ├── SchedulerUnavailable 3    slurm-unavailable   launcher slurm: no sbatch/squeue on the login node
    ├── RemoteError         1     (the wire's code)   the supervisor answered an error (default internal)
    │   └── UnknownJob      2     unknown-job         no such job id on the host or in the local index
    ├── NoResult            1     no-result           the job wrote no result.json
    │   └── ResultNotYet    75    result-not-yet      the job is still running: call again
    ├── LocalStateError     2     local-state         the controller's state dir cannot be read or written
    ├── LogShrank           3     log-shrank          the host's log is shorter than tail's cursor (reset to 0)
    ├── BadBaseline         2     bad-baseline        a regression-gate baseline file that cannot be used
    └── NotAllowed          2     not-allowed         `runner mcp` refused a call its flags do not allow
    (click's usage errors)  2     usage               an unknown option, a missing argument
    Interrupted             130   aborted             Ctrl-C or SIGTERM: a KeyboardInterrupt, outside the tree
"""
from __future__ import annotations

from collections.abc import Iterable

from remote_payload.contract import ERRORS as WIRE_ERRORS
from remote_payload.contract import STATES, is_terminal

EXIT_OK = 0             # done, accepted, SUCCEEDED, healthy
EXIT_FAILED = 1         # the job ended other than SUCCEEDED, no result, the service failed to come back
EXIT_USAGE = 2          # bad spec or usage, unknown job id
EXIT_UNREACHABLE = 3    # host unreachable, auth failed, host key unknown or changed
EXIT_REFUSED = 4        # preflight refused
EXIT_BUSY = 5           # a lock is held by another job
EXIT_STILL_RUNNING = 75  # still running / still starting: call again (EX_TEMPFAIL)
EXIT_ABORTED = 130      # interrupted (Ctrl-C, SIGTERM)


CODE_USAGE = "usage"


class RunnerError(Exception):
    """Anything else; the message says what."""

    exit_code = EXIT_FAILED
    code = "internal"
    hint = ""

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        if hint:
            self.hint = hint


class SpecError(RunnerError):
    """A bad job spec or bad command-line usage (the message names the file and the field)."""

    exit_code = EXIT_USAGE
    code = "bad-spec"


class TransportError(RunnerError):
    """The host cannot be reached, or a call timed out or lost its link."""

    exit_code = EXIT_UNREACHABLE
    code = "host-unreachable"
    retry = True  # a lost link or a host that did not answer: an idempotent call may be made again


class UploadCut(TransportError):
    """The command's --max-wait ran out while a bundle was uploading: the host keeps each file that arrived
    whole, and the next submit of the job sends only the rest. Not retried within this command: its time is up."""

    code = "upload-cut"
    retry = False


class HostKeyError(TransportError):
    """The host key is unknown or changed (the message has the fingerprint)."""

    code = "host-key"
    retry = False


class AuthFailed(TransportError):
    """The host refused the login. Never retried (as Ansible never retries authentication): each failed try
    counts towards the host's lockout (pam_faillock, MaxAuthTries, fail2ban)."""

    code = "auth-failed"
    retry = False


class BadAnswer(TransportError):
    """The host's answer breaks the wire contract (a broken or compromised supervisor): nothing of it is used."""

    code = "bad-answer"
    retry = False  # asking again gets the same answer from the same supervisor


class PreflightError(RunnerError):
    """The host cannot run this job now (memory, the stop policy, a GPU, an engine, a payload that cannot start): nothing was touched."""

    exit_code = EXIT_REFUSED
    code = "preflight-refused"


class HostBusy(RunnerError):
    """A lock is held by another job; the message names the holder."""

    exit_code = EXIT_BUSY
    code = "busy"


class SchedulerUnavailable(RunnerError):
    """Slurm cannot be used from the login node (not a lost link: never retried)."""

    exit_code = EXIT_UNREACHABLE
    code = "slurm-unavailable"


class RemoteError(RunnerError):
    """code: the wire's `error` code of the host's answer when it is one of the contract's, else the class's
    (a host cannot add codes to the controller's contract)."""

    def __init__(self, message: str, *, code: str | None = None, answer: dict | None = None, hint: str = "") -> None:
        super().__init__(message, hint=hint)
        if code in WIRE_ERRORS:
            self.code = code
        self.answer = answer or {}


class UnknownJob(RemoteError):
    """No job with this id on the host or in the local index."""

    exit_code = EXIT_USAGE
    code = "unknown-job"


class NoResult(RunnerError):
    """The job wrote no result, or one the answer cannot carry."""

    code = "no-result"


class ResultNotYet(NoResult):
    """`results` of a job that has not ended: not a failure, the caller asks again later."""

    exit_code = EXIT_STILL_RUNNING
    code = "result-not-yet"


class LocalStateError(RunnerError):
    """The controller's own state dir ($RUNNER_STATE_DIR) cannot be written or read: checked before any host."""

    exit_code = EXIT_USAGE
    code = "local-state"


class LogShrank(RunnerError):
    """The host's log is shorter than the stored cursor (it shrank or was replaced): the cursor is reset to 0."""

    exit_code = EXIT_UNREACHABLE
    code = "log-shrank"


class BadBaseline(RunnerError):
    """A regression-gate baseline file that cannot be used (runner/results/gate.py)."""

    exit_code = EXIT_USAGE
    code = "bad-baseline"


class NotAllowed(RunnerError):
    """What the MCP server was not started to allow (runner/mcp/mcp_policy.py); the hint names the flag."""

    exit_code = EXIT_USAGE
    code = "not-allowed"


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM: the message says what became of a job the command was starting. A KeyboardInterrupt,
    so that nothing handling the tree's errors swallows it."""

    exit_code = EXIT_ABORTED
    code = "aborted"

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (its class's name when it has none): what a one-line report shows."""
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def exit_for(code: str) -> int:
    """The exit status of an error code of this tree (`--json`'s `error`, a status row's); 1 for any other."""
    todo = [RunnerError]
    while todo:
        cls = todo.pop()
        if cls.code == code:
            return cls.exit_code
        todo.extend(cls.__subclasses__())
    return EXIT_FAILED


# -- outcomes that are not errors -------------------------------------------------------------------------------

def exit_code(state: str | None, *, settled: bool = True) -> int:
    """The exit status for what a command found: a job state, or a restore's service state (healthy/starting/
    failed). settled=False: there is more to come (tail has output left to print), so "call again"."""
    if not settled or state == "starting" or (state in STATES and not is_terminal(state)):
        return EXIT_STILL_RUNNING
    return EXIT_OK if state in ("SUCCEEDED", "healthy") else EXIT_FAILED


# Worst first, when one command reports on many jobs or hosts: ended badly (or any error), one we cannot see,
# one still going, one done.
_RANK = {EXIT_OK: 0, EXIT_STILL_RUNNING: 1, EXIT_UNREACHABLE: 2}


def worst(codes: Iterable[int]) -> int:
    """The exit status of a command over many jobs or hosts: the worst of theirs wins."""
    return max(codes, key=lambda code: _RANK.get(code, 3), default=EXIT_OK)
