"""One job's time budget: every bound the host puts on a job, computed once from its spec when the job dir is
claimed and recorded in status.json's `budget` ({name: seconds, minutes or epoch}). The guard, the guard timer,
the unit and the Slurm batch read the recorded numbers (each Bound names its reader), so a restorer or a
guard starting later uses the ones the job started with.

BOUNDS is the table docs/protocol.md shows ("Time budget"): a bound's formula is the very expression
evaluated here, over the spec's terms (`terms`) and the constants below, so the two cannot say different
things. A formula may use the bounds above it.
"""
from __future__ import annotations

import math
from collections import namedtuple

from ..contract import DEFAULTS, services_of
from ..host.gpu import SMI_TIMEOUT_S
from ..host.processes import CMD_TIMEOUT_S, KILL_CONFIRM_S
from ..slurm.batch import SLACK_S, setup_seconds, time_limit_minutes
from .spec import variant_rounds

STOP_TIMEOUT_S = 600.0   # `systemctl stop` of an inference server may wait for long requests to drain
HANG_MARGIN_S = 20.0     # past every wait of its step at its own bound, a live supervisor counts as hung
MINUTE_S = 60.0          # the guard timer's and each unit stop phase's last margin
CONSTANTS = {"STOP_TIMEOUT_S": STOP_TIMEOUT_S, "CMD_TIMEOUT_S": CMD_TIMEOUT_S, "KILL_CONFIRM_S": KILL_CONFIRM_S,
             "SMI_TIMEOUT_S": SMI_TIMEOUT_S, "HANG_MARGIN_S": HANG_MARGIN_S, "MINUTE_S": MINUTE_S,
             "SLACK_S": SLACK_S}

Bound = namedtuple("Bound", "name formula reader why launcher")

BOUNDS = (
    Bound("guard_timer_s", "rounds * (max_runtime + grace) + 2 * drain_timeout + STOP_TIMEOUT_S + CMD_TIMEOUT_S "
          "+ health_timeout + MINUTE_S", "supervision.restore.settle.start_guard_timer: systemd-run --on-active=",
          "made just before the stop: later than any job still handled could end (each round's run and grace, "
          "two drains, the stop and the start commands, the health wait, a minute)", None),
    Bound("adopted_timer_s", "prepare_timeout + stage_timeout + guard_timer_s",
          "supervision.restore.restorers.adopt_stop: the guard timer of an adopted stop", "made when the job takes a dead "
          "job's stop over, before its own prepare step and staging: those first, then all the guard timer counts",
          None),
    Bound("runtime_max_s", "queue_timeout + prepare_timeout + stage_timeout + guard_timer_s",
          "supervision.unit.run_argv: RuntimeMaxSec=", "the unit starts before the lock wait (--queue), the "
          "prepare step and the staging; then all the guard timer counts", None),
    Bound("timeout_stop_s", "grace + KILL_CONFIRM_S + drain_timeout + SMI_TIMEOUT_S + CMD_TIMEOUT_S "
          "+ health_timeout + MINUTE_S", "supervision.unit.run_argv: TimeoutStopSec=",
          "each stop phase of the unit: the supervisor settling after a TERM, then ExecStopPost='s restore", None),
    Bound("hung_running_s", "max_runtime + grace + KILL_CONFIRM_S + drain_timeout + SMI_TIMEOUT_S + HANG_MARGIN_S",
          "supervision.restore.guard.hard_deadline", "from payload.started_at (a sweep: the running variant's "
          "start): the run, TERM grace, KILL, the GPU release wait; then it must be restoring", None),
    Bound("hung_restoring_s", "grace + KILL_CONFIRM_S + drain_timeout + SMI_TIMEOUT_S + CMD_TIMEOUT_S "
          "+ health_timeout + HANG_MARGIN_S", "supervision.restore.guard.hard_deadline",
          "from entering RESTORING: leftovers killed, the GPU released, the start command, the health wait", None),
    Bound("hung_draining_s", "drain_timeout + SMI_TIMEOUT_S + HANG_MARGIN_S",
          "supervision.restore.guard.hard_deadline", "from entering DRAINING: the drain and its last "
          "nvidia-smi call", None),
    Bound("hung_stopping_s", "STOP_TIMEOUT_S + CMD_TIMEOUT_S + HANG_MARGIN_S",
          "supervision.restore.guard.hard_deadline", "from entering STOPPING_SERVICE: the stop at its own "
          "bound and the state check after it", None),
    Bound("ends_by_at", "claimed_at + runtime_max_s + 2 * timeout_stop_s", "status.json readers (an epoch)",
          "the latest the unit lets the job hold the host: its run, then both stop phases", None),
    Bound("slurm_time_min", "max(time_min, time_limit_minutes(max_runtime, grace, setup))",
          "slurm.launch.submit_argv: sbatch --time= (minutes)", "slurm.time_min as the controller sent it, never below "
          "what our own deadline needs (time_limit_minutes: ceil((setup + max_runtime + grace + SLACK_S) / 60))",
          "slurm"),
)


def terms(spec: dict, queue: bool) -> dict:
    """The spec's numbers the formulas use; a term the job does not have counts 0 (no --queue, not staged).
    A partial spec (a record rebuilt from less) gets the defaults: a job's record is never refused for it."""
    limits, gpu = spec.get("limits") or {}, spec.get("gpu") or {}
    return {"rounds": variant_rounds(spec), "max_runtime": limits.get("max_runtime", DEFAULTS["limits.max_runtime"]),
            "grace": limits.get("grace", DEFAULTS["limits.grace"]),
            "drain_timeout": gpu.get("drain_timeout", DEFAULTS["gpu.drain_timeout"]),
            "health_timeout": _health_timeout(spec),
            "queue_timeout": limits.get("queue_timeout", DEFAULTS["limits.queue_timeout"]) if queue else 0,
            "prepare_timeout": limits.get("prepare_timeout", 0),
            "stage_timeout": limits.get("stage_timeout", 0) if (spec.get("payload") or {}).get("staged") else 0,
            "setup": setup_seconds(limits, spec.get("payload") or {}),
            "time_min": (spec.get("slurm") or {}).get("time_min") or 0}


def _health_timeout(spec: dict) -> float:
    """The longest health wait of the services the job frees: their restores run at once."""
    freed = services_of(spec) if isinstance(spec.get("service"), dict) else []
    return max([s.get("health_timeout", 0) for s in freed] or [(spec.get("service") or {}).get("health_timeout", 0)])


def budget(spec: dict, claimed_at: float, queue: bool = False) -> dict:
    """Every bound of BOUNDS that applies to this job's launcher, {name: number}."""
    launcher = spec.get("launcher", "ssh")
    known = dict(CONSTANTS, **terms(spec, queue), claimed_at=claimed_at)
    # The formulas are this module's own constant strings (never input); no builtins but the two they use.
    scope = {"__builtins__": {}, "max": max, "ceil": math.ceil, "time_limit_minutes": time_limit_minutes}
    found = {}
    for bound in BOUNDS:
        if bound.launcher in (None, launcher):
            found[bound.name] = known[bound.name] = eval(bound.formula, scope, dict(known))
    return found


def recorded(spec: dict, status: dict) -> dict:
    """The budget status.json holds, recomputed from the spec when it is missing or malformed."""
    kept = status.get("budget")
    wanted = budget(spec, status.get("created_at") or 0.0)
    if isinstance(kept, dict) and all(isinstance(kept.get(name), (int, float)) and not isinstance(kept[name], bool)
                                      for name in wanted):
        return kept
    return wanted
