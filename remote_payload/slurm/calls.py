"""The Slurm client calls a login node makes, for one job and a job array alike: each command bounded, a
slurmctld that does not answer named as such, and the file that caches Slurm's answer (slurm.json).
"""
from __future__ import annotations

import os
import subprocess
import time

from ..host.answer import Fail
from ..supervision.files import JobPaths, append_line, write_json_atomic

SLURM_POLL_S = 5.0       # ask Slurm about one job at most this often
QUERY_TIMEOUT_S = 4.0    # squeue/sacct/scancel: short, so `logs --wait` stays within its bound
CANCEL_SLACK_S = 30.0    # a cancelled job still running grace + this long after the request gets plain scancel
UNREACHABLE = ("Unable to contact slurm controller", "Socket timed out", "Connection refused",
               "Zero Bytes were transmitted")


def slurm_file(paths: JobPaths) -> str:
    return os.path.join(paths.dir, "slurm.json")


def slurm_call(argv: list, stdin: str = "", timeout: float = QUERY_TIMEOUT_S, env=None) -> subprocess.CompletedProcess:
    """A Slurm client command (no shell); missing tools and hangs are `slurm-unavailable`."""
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, env=env)
    except FileNotFoundError:
        raise Fail("slurm-unavailable", "%s is not installed on the login node" % argv[0]) from None
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", "%s did not answer within %.0f s" % (argv[0], timeout))


def scancel_if_late(paths: JobPaths, known: dict, grace: float) -> None:
    """A cancel not done within grace + CANCEL_SLACK_S: plain scancel (Slurm's TERM, then KILL after KillWait)."""
    if time.time() - os.path.getmtime(paths.cancel) > grace + CANCEL_SLACK_S:
        slurm_call(["scancel", known["job_id"]])
        write_json_atomic(slurm_file(paths), dict(known, scancel_at=time.time()))
        append_line(paths.events, {"t": time.time(), "event": "slurm-scancel", "why": "cancel not done in time"})


def raise_if_unreachable(done: subprocess.CompletedProcess, tool: str) -> None:
    if done.returncode != 0 and (done.returncode == 124 or any(s in done.stderr for s in UNREACHABLE)):
        raise Fail("slurm-unavailable", "%s: slurmctld does not answer: %s" % (tool, done.stderr.strip()[-500:]))
