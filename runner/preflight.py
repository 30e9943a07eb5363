"""Decide at submit time, from one preflight report of the host, whether the job can run and how.

Pure functions: the supervisor decides again on the host when the job starts (time passes); this is the
early, explained refusal so a user learns "why not" before anything is stopped.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from remote_payload.contract import memory_verdict

from .errors import HostBusy, PreflightError


@dataclass
class Decision:
    stop_service: bool
    notes: list[str] = field(default_factory=list)


def decide(wire: dict, report: dict, *, queue: bool = False) -> Decision:
    """Raise PreflightError/HostBusy when the job cannot run; else say whether the service will be stopped."""
    if not queue:
        _refuse_if_locked(report.get("locks", []), wire["job_id"])
    service, gpu = wire["service"], wire["gpu"]
    _refuse_if_engine_cannot(service, report)
    stop_policy = service.get("stop", "never") if service["manager"] != "none" else "never"
    if not gpu["devices"]:
        return Decision(stop_policy == "always", ["no GPUs requested: no memory check"])
    short = _short_gpus(gpu, report)
    if not short:
        notes = [f"GPU {g['index']}: {g['free_mib']} MiB free >= {gpu['required_mib']} MiB needed" for g in _selected(gpu, report)]
        return Decision(stop_policy == "always", notes)
    return _decide_short(short, stop_policy, service, report, gpu["required_mib"], queue)


def _refuse_if_locked(locks: list[dict], job_id: str) -> None:
    """A lock held by this very job id is a retried submit of a job already running, not a busy host."""
    for lock in locks:
        if lock.get("held") and (lock.get("holder") or {}).get("job_id") != job_id:
            raise HostBusy(f"host busy: {lock['key']} is held by {describe_holder(lock.get('holder'))}",
                           hint="Wait for that job (`runner tail ID -f`), cancel it, or submit with --queue.")


def _refuse_if_engine_cannot(service: dict, report: dict) -> None:
    """service.free sglang/vllm: the host asked the engine (without touching it) whether it can free memory.
    A unit that is not running, or that a runner job holds released, is judged by the rules below instead."""
    engine = (report.get("service") or {}).get("engine") or {}
    if not engine.get("error") or (report.get("service") or {}).get("active_state") != "active" \
            or _runner_holds_stopped(report, service["unit"]):
        return
    raise PreflightError(f"service.free is {service['free']}, but {engine['error']}",
                         hint="Start the engine with its memory API (SGLang: --enable-memory-saver; vLLM: "
                              "--enable-sleep-mode and VLLM_SERVER_DEV_MODE=1), or use `service.free: stop`.")


def _runner_holds_stopped(report: dict, unit: str) -> str | None:
    """The runner job that holds `unit` stopped: the host ledger's entry, or the holder of its held lock."""
    entry = (report.get("service") or {}).get("ledger")
    if entry and entry.get("job_id"):
        return entry["job_id"]
    for lock in report.get("locks", []):
        if lock.get("key") == f"service-{unit}" and lock.get("held"):
            return (lock.get("holder") or {}).get("job_id") or "unknown"
    return None


def describe_holder(holder: dict | None) -> str:
    if not holder:
        return "an unknown process"
    return f"job {holder.get('job_id', '?')} (supervisor pid {holder.get('pid', '?')})"


def _selected(gpu: dict, report: dict) -> list[dict]:
    found = {str(g["index"]): g for g in report.get("gpus", [])}
    found.update({g["uuid"]: g for g in report.get("gpus", []) if g.get("uuid")})
    if not report.get("nvidia_smi", True):
        raise PreflightError("the job asks for GPUs but nvidia-smi is not available on the host")
    missing = [str(d) for d in gpu["devices"] if str(d) not in found]
    if missing:
        have = ", ".join(f"{g['index']} ({g.get('uuid', '?')})" for g in report.get("gpus", [])) or "none"
        raise PreflightError(f"GPU {', '.join(missing)} not found on the host; it has: {have}")
    return [found[str(d)] for d in gpu["devices"]]


def _short_gpus(gpu: dict, report: dict) -> list[dict]:
    """The selected GPUs whose memory is short (contract.memory_verdict: the host applies the same rule)."""
    need = gpu["required_mib"]
    verdicts = [(g, memory_verdict(g, need)) for g in _selected(gpu, report)]
    for g, verdict in verdicts:
        if verdict == "too-small":
            raise PreflightError(f"the job needs {need} MiB but GPU {g['index']} has only {g['total_mib']} MiB in total",
                                 hint="Reduce the problem (e.g. fewer experts) or use a larger GPU.")
    return [g for g, verdict in verdicts if verdict == "short"]  # unknown free memory counts as short


def _decide_short(short: list[dict], stop_policy: str, service: dict, report: dict, need: int,
                  queue: bool = False) -> Decision:
    gaps = "; ".join(f"GPU {g['index']}: {g['free_mib']} MiB free < {need} MiB needed" for g in short)
    holders = ", ".join(f"pid {a['pid']} ({a['used_mib']} MiB)" for a in report.get("apps", [])) or "unknown"
    if stop_policy == "never" or service["manager"] == "none":
        why = "service.stop is never" if service["manager"] != "none" else "there is no service to stop"
        raise PreflightError(f"{gaps}; {why}. Memory is held by: {holders}",
                             hint="Free the GPU, lower gpu.min_free_mib, or allow `service.stop: if-needed`.")
    state = (report.get("service") or {}).get("active_state")
    holder = _runner_holds_stopped(report, service["unit"])
    if state != "active" and queue and holder:
        # Another runner job stopped it and will restore it: a queued job waits for that, and the host
        # decides the stop again when the locks are ours.
        return Decision(False, [gaps, f"the service {service['unit']} is {state}: stopped by runner job {holder}, "
                                      "which restores it; queued behind it, the host decides the stop again"])
    if state != "active":
        raise PreflightError(f"{gaps}; the service {service['unit']} is {state or 'unknown'}, so stopping it "
                             f"frees nothing. Memory is held by: {holders}")
    if service.get("free", "stop") != "stop":
        return Decision(True, [gaps, f"will release GPU memory of {service['unit']} through its {service['free']} "
                                     "API and resume it afterwards (the unit keeps running)"])
    return Decision(True, [gaps, f"will stop {service['unit']} and restore it afterwards"])
