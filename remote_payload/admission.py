"""May this job start on this host now, and will it stop the service: the one rule, applied to a preflight report.

The host's `submit` applies it and either starts the job in the same call or answers the refusal; the
controller applies the same function for `submit --dry-run` (runner/remote/preflight.py wraps it) and the
supervisor's own stop at start time uses `needs_stop`. Pure, stdlib only, Python >= 3.8; the verdict is
plain data so it crosses the wire as it is:

    {"refuse": {"code": "busy" | "preflight-refused", "message": …, "hint": …, "holder": {…}}}  (holder: busy only)
    {"start": True, "stop_service": bool, "notes": [str, …]}

A busy message names the lock and its holder without the "host busy: " the controller puts before it.
"""
from __future__ import annotations

from .contract import memory_verdict

BUSY_HINT = "Wait for that job (`runner tail ID -f`), cancel it, or submit with --queue."
ENGINE_HINT = ("Start the engine with its memory API (SGLang: --enable-memory-saver; vLLM: "
               "--enable-sleep-mode and VLLM_SERVER_DEV_MODE=1), or use `service.free: stop`.")
TOO_SMALL_HINT = "Reduce the problem (e.g. fewer experts) or use a larger GPU."
NEVER_HINT = "Free the GPU, lower gpu.min_free_mib, or allow `service.stop: if-needed`."


class _Refused(Exception):
    def __init__(self, code: str, message: str, hint: str = "", holder=None) -> None:
        super().__init__(message)
        self.verdict = {"code": code, "message": message, "hint": hint}
        if holder is not None:
            self.verdict["holder"] = holder


def admit(spec: dict, report: dict, queue: bool = False) -> dict:
    """The verdict for the wire spec `spec` (its job_id, gpu, service) on the preflight `report`."""
    try:
        return _admit(spec, report, queue)
    except _Refused as refused:
        return {"refuse": refused.verdict}


def needs_stop(policy: str, short: bool) -> bool:
    """The stop policy applied: `always` stops, `never` never does, `if-needed` stops when memory is short."""
    return policy == "always" or (policy == "if-needed" and short)


def describe_holder(holder) -> str:
    if not holder:
        return "an unknown process"
    return "job %s (supervisor pid %s)" % (holder.get("job_id", "?"), holder.get("pid", "?"))


def _admit(spec: dict, report: dict, queue: bool) -> dict:
    if not queue:
        _refuse_if_locked(report.get("locks", []), spec["job_id"])
    service, gpu = spec["service"], spec["gpu"]
    _refuse_if_engine_cannot(service, report)
    stop_policy = service.get("stop", "never") if service["manager"] != "none" else "never"
    if not gpu["devices"]:
        return _start(needs_stop(stop_policy, False), ["no GPUs requested: no memory check"])
    short = _short_gpus(gpu, report)
    if not short:
        notes = ["GPU %s: %s MiB free >= %s MiB needed" % (g["index"], g["free_mib"], gpu["required_mib"])
                 for g in _selected(gpu, report)]
        return _start(needs_stop(stop_policy, False), notes)
    return _decide_short(short, stop_policy, service, report, gpu["required_mib"], queue)


def _start(stop_service: bool, notes: list) -> dict:
    return {"start": True, "stop_service": stop_service, "notes": notes}


def _refuse_if_locked(locks: list, job_id: str) -> None:
    """A lock held by this very job id is a retried submit of a job already running, not a busy host."""
    for lock in locks:
        holder = lock.get("holder") or {}
        if lock.get("held") and holder.get("job_id") != job_id:
            raise _Refused("busy", "%s is held by %s" % (lock["key"], describe_holder(lock.get("holder"))),
                           BUSY_HINT, dict(holder, key=lock["key"]))


def _refuse_if_engine_cannot(service: dict, report: dict) -> None:
    """service.free sglang/vllm: the host asked the engine (without touching it) whether it can free memory.
    A unit that is not running, or that a runner job holds released, is judged by the rules below instead."""
    engine = (report.get("service") or {}).get("engine") or {}
    if not engine.get("error") or (report.get("service") or {}).get("active_state") != "active" \
            or _runner_holds_stopped(report, service["unit"]):
        return
    raise _Refused("preflight-refused", "service.free is %s, but %s" % (service["free"], engine["error"]), ENGINE_HINT)


def _runner_holds_stopped(report: dict, unit: str):
    """The runner job that holds `unit` stopped: the host ledger's entry, or the holder of its held lock."""
    entry = (report.get("service") or {}).get("ledger")
    if entry and entry.get("job_id"):
        return entry["job_id"]
    for lock in report.get("locks", []):
        if lock.get("key") == "service-%s" % unit and lock.get("held"):
            return (lock.get("holder") or {}).get("job_id") or "unknown"
    return None


def _selected(gpu: dict, report: dict) -> list:
    found = {str(g["index"]): g for g in report.get("gpus", [])}
    found.update({g["uuid"]: g for g in report.get("gpus", []) if g.get("uuid")})
    if not report.get("nvidia_smi", True):
        raise _Refused("preflight-refused", "the job asks for GPUs but nvidia-smi is not available on the host")
    missing = [str(d) for d in gpu["devices"] if str(d) not in found]
    if missing:
        have = ", ".join("%s (%s)" % (g["index"], g.get("uuid", "?")) for g in report.get("gpus", [])) or "none"
        raise _Refused("preflight-refused", "GPU %s not found on the host; it has: %s" % (", ".join(missing), have))
    return [found[str(d)] for d in gpu["devices"]]


def _short_gpus(gpu: dict, report: dict) -> list:
    """The selected GPUs whose memory is short (contract.memory_verdict: unknown free memory counts as short)."""
    need = gpu["required_mib"]
    verdicts = [(g, memory_verdict(g, need)) for g in _selected(gpu, report)]
    for g, verdict in verdicts:
        if verdict == "too-small":
            raise _Refused("preflight-refused", "the job needs %s MiB but GPU %s has only %s MiB in total"
                           % (need, g["index"], g["total_mib"]), TOO_SMALL_HINT)
    return [g for g, verdict in verdicts if verdict == "short"]


def _decide_short(short: list, stop_policy: str, service: dict, report: dict, need: int, queue: bool) -> dict:
    gaps = "; ".join("GPU %s: %s MiB free < %s MiB needed" % (g["index"], g["free_mib"], need) for g in short)
    holders = ", ".join("pid %s (%s MiB)" % (a["pid"], a["used_mib"]) for a in report.get("apps", [])) or "unknown"
    if stop_policy == "never" or service["manager"] == "none":
        why = "service.stop is never" if service["manager"] != "none" else "there is no service to stop"
        raise _Refused("preflight-refused", "%s; %s. Memory is held by: %s" % (gaps, why, holders), NEVER_HINT)
    state = (report.get("service") or {}).get("active_state")
    holder = _runner_holds_stopped(report, service["unit"])
    if state != "active" and queue and holder:
        # Another runner job stopped it and will restore it: a queued job waits for that, and the host
        # decides the stop again when the locks are ours.
        return _start(False, [gaps, "the service %s is %s: stopped by runner job %s, which restores it; queued "
                                    "behind it, the host decides the stop again" % (service["unit"], state, holder)])
    if state != "active":
        raise _Refused("preflight-refused", "%s; the service %s is %s, so stopping it frees nothing. Memory is held "
                       "by: %s" % (gaps, service["unit"], state or "unknown", holders))
    if service.get("free", "stop") != "stop":
        return _start(True, [gaps, "will release GPU memory of %s through its %s API and resume it afterwards (the "
                                   "unit keeps running)" % (service["unit"], service["free"])])
    return _start(True, [gaps, "will stop %s and restore it afterwards" % service["unit"]])
