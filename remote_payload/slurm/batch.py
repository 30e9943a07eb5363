"""The sbatch call that puts one runner job on Slurm: its argv and its batch script. Pure, stdlib only.

Every option the user chose travels as its own argv word, never through `#SBATCH` lines (sbatch splits those
itself) or a shell; the script's only variable parts are shell-quoted. In the allocation the script execs our
supervisor, the batch step's main process, so Slurm's SIGTERM (scancel, time limit) reaches it first.

The time limit: Slurm's is set SLACK_S later than the job's own setup + max_runtime + grace (in whole
minutes), so that at the deadline our supervisor, not Slurm, ends the payload and writes TIMED_OUT with the
log intact; Slurm's is the backstop. `--no-requeue`: a job dir holds one run, so a node failure or a
preemption ends the job (LOST) instead of running the payload again over a half-written job dir.
"""
from __future__ import annotations

import math
import re
import shlex
from typing import Mapping

SLACK_S = 60.0  # supervisor start, the final status write, the GPU check in the allocation
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")              # partition, account, qos
GRES_RE = re.compile(r"[A-Za-z0-9_.-]+(?::[A-Za-z0-9_.-]+)?:[1-9][0-9]{0,3}(?:,[A-Za-z0-9_.:-]+)*")
GPUS_RE = re.compile(r"(?:[A-Za-z0-9_.-]+:)?[1-9][0-9]{0,3}")             # --gpus: N or TYPE:N
CONSTRAINT_RE = re.compile(r"[A-Za-z0-9_.&|!*()\[\]:,-]{1,256}")        # a Slurm feature expression
# Options that runner itself sets or that would break what it relies on (one run per job dir, the
# parsable answer, its own output and time limit); extra_args may not repeat them.
MAX_DOWNTIME_ON_SLURM = ("limits.max_downtime is a service window; launcher slurm has none (the scheduler owns the "
                         "GPUs and each variant of a sweep gets its own allocation): leave it out")
OWNED_OPTIONS = ("--parsable", "--job-name", "--output", "--error", "--chdir", "--time", "--requeue",
                 "--no-requeue", "--array", "--wrap", "--partition", "--gres", "--gpus", "--account",
                 "--qos", "--constraint", "--wait", "--test-only", "--hold", "--open-mode", "--export")


def slurm_problem(slurm: dict) -> str | None:
    """None when the spec's `slurm` section (wire form) is acceptable, else what is allowed."""
    for field in ("partition", "account", "qos"):
        value = slurm.get(field)
        if value is not None and not (isinstance(value, str) and NAME_RE.fullmatch(value)):
            return "slurm.%s must be a Slurm name ([A-Za-z0-9._-], at most 128); got %r" % (field, value)
    if slurm.get("gres") is not None and slurm.get("gpus") is not None:
        return "slurm.gres and slurm.gpus are two ways to ask for GPUs; give one"
    gres, gpus = slurm.get("gres"), slurm.get("gpus")
    if gres is not None and not (isinstance(gres, str) and GRES_RE.fullmatch(gres)):
        return "slurm.gres must look like gpu:2 or gpu:a100:2; got %r" % (gres,)
    if gpus is not None and not GPUS_RE.fullmatch(str(gpus)):
        return "slurm.gpus must be a count (2) or TYPE:COUNT (a100:2); got %r" % (gpus,)
    constraint = slurm.get("constraint")
    if constraint is not None and not (isinstance(constraint, str) and CONSTRAINT_RE.fullmatch(constraint)):
        return ("slurm.constraint must be a Slurm feature expression (letters, digits, &|!*()[]:,.-_); got %r"
                % (constraint,))
    return extra_args_problem(slurm.get("extra_args") or [])


def extra_args_problem(extra_args: list) -> str | None:
    """Each extra arg is one sbatch option word: `--name=value` (or `--flag`), no newline, not one we own."""
    for arg in extra_args:
        if not isinstance(arg, str) or not arg.startswith("--") or "\n" in arg or "\0" in arg:
            return "slurm.extra_args are sbatch options written --name=value, one per item; got %r" % (arg,)
        name = arg.split("=", 1)[0]
        if name in OWNED_OPTIONS:
            return "slurm.extra_args may not set %s: runner sets it (use the slurm section's fields)" % name
    return None


def setup_seconds(limits: dict, payload: dict) -> float:
    """What the allocation runs before the payload, at its bounds: the prepare step and the staging."""
    return ((limits.get("prepare_timeout", 0) if payload.get("prepare") is not None else 0)
            + (limits.get("stage_timeout", 0) if payload.get("staged") else 0))


def time_limit_minutes(max_runtime: float, grace: float, setup: float = 0.0, slack: float = SLACK_S) -> int:
    """Slurm's --time for a job whose own deadline is setup + max_runtime + grace: `slack` later."""
    return max(1, math.ceil((setup + max_runtime + grace + slack) / 60.0))


def time_problem(minutes: int, max_runtime: float, grace: float, setup: float = 0.0) -> str | None:
    """An explicit slurm.time shorter than what our deadline needs would let Slurm kill the job first."""
    need = time_limit_minutes(max_runtime, grace, setup)
    if minutes < need:
        before = " + its prepare step and staging (%.0f s)" % setup if setup else ""
        return ("slurm.time is %d min, shorter than limits.max_runtime + grace%s + %.0f s = %d min; raise it "
                "or lower limits.max_runtime" % (minutes, before, SLACK_S, need))
    return None


def sbatch_argv(slurm: dict, job_id: str, job_dir: str, minutes: int, array=None) -> list:
    """`sbatch --parsable …` for one job; the batch script goes on stdin. Call after slurm_problem.
    array: (variants, max_parallel) for a sweep, one array task per variant, each its own slurm-%A_%a.out."""
    output = "/slurm-%A_%a.out" if array else "/slurm-%j.out"
    argv = ["sbatch", "--parsable", "--no-requeue", "--job-name=runner-" + job_id,
            "--chdir=" + _slurm_path(job_dir), "--output=" + _slurm_path(job_dir) + output,
            "--time=%d" % minutes] + ([array_option(*array)] if array else [])
    for field, option in (("partition", "--partition"), ("account", "--account"), ("qos", "--qos"),
                          ("constraint", "--constraint"), ("gres", "--gres"), ("gpus", "--gpus")):
        if slurm.get(field) is not None:
            argv.append("%s=%s" % (option, slurm[field]))
    return argv + list(slurm.get("extra_args") or [])


def batch_script(python: str, supervisor: str, root: str, job_id: str) -> str:
    """The script sbatch runs in the allocation: exec our supervisor's in-allocation run of the job."""
    command = shlex.join([python, supervisor, "slurm-run", "--job-id", job_id, "--root", root])
    return "#!/bin/sh\n# runner job %s: the supervisor runs the payload in this allocation\nexec %s\n" % (
        job_id, command)


def parse_sbatch_parsable(stdout: str) -> str:
    """`sbatch --parsable` prints JOBID or JOBID;CLUSTER; the job id, or ValueError for anything else."""
    first = stdout.strip().split(";", 1)[0]
    if not first.isdigit():
        raise ValueError("sbatch --parsable printed no job id: %r" % stdout[:200])
    return first


def _slurm_path(path: str) -> str:
    """sbatch expands %-patterns and backslashes in --output/--chdir paths; a job dir must contain neither."""
    if not path.startswith("/") or "%" in path or "\\" in path or "\n" in path:
        raise ValueError("a Slurm job dir must be absolute, without '%%', '\\' or newlines: %r" % path)
    return path


# ── job arrays (a sweep's variants: remote_payload/slurm/array.py) ──────────────────────────────────────

def array_option(variants: int, max_parallel: int) -> str:
    """sbatch's `--array=0-(N-1)%k` for N variants, at most k tasks running at once."""
    if variants < 1 or max_parallel < 1:
        raise ValueError("a job array needs at least one variant and max_parallel >= 1; got %r, %r"
                         % (variants, max_parallel))
    return "--array=0-%d%%%d" % (variants - 1, min(max_parallel, variants))


def array_task_index(environ: Mapping[str, str], variants: int) -> int:
    """The variant this array task runs: Slurm's SLURM_ARRAY_TASK_ID, checked against 0..N-1 (ValueError
    when it is missing or out of range: a task must never run another task's variant or none)."""
    text = environ.get("SLURM_ARRAY_TASK_ID", "")
    if not text.isdigit() or int(text) >= variants:
        raise ValueError("SLURM_ARRAY_TASK_ID %r is not a variant index 0..%d" % (text, variants - 1))
    return int(text)
