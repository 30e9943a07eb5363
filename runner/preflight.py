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
    stop_policy = service.get("stop", "never") if service["manager"] != "none" else "never"
    if not gpu["devices"]:
        return Decision(stop_policy == "always", ["no GPUs requested: no memory check"])
    short = _short_gpus(gpu, report)
    if not short:
        notes = [f"GPU {g['index']}: {g['free_mib']} MiB free >= {gpu['required_mib']} MiB needed" for g in _selected(gpu, report)]
        return Decision(stop_policy == "always", notes)
    return _decide_short(short, stop_policy, service, report, gpu["required_mib"])


def _refuse_if_locked(locks: list[dict], job_id: str) -> None:
    """A lock held by this very job id is a retried submit of a job already running, not a busy host."""
    for lock in locks:
        if lock.get("held") and (lock.get("holder") or {}).get("job_id") != job_id:
            raise HostBusy(f"host busy: {lock['key']} is held by {describe_holder(lock.get('holder'))}",
                           hint="Wait for that job (`runner tail ID -f`), cancel it, or submit with --queue.")


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


def _decide_short(short: list[dict], stop_policy: str, service: dict, report: dict, need: int) -> Decision:
    gaps = "; ".join(f"GPU {g['index']}: {g['free_mib']} MiB free < {need} MiB needed" for g in short)
    holders = ", ".join(f"pid {a['pid']} ({a['used_mib']} MiB)" for a in report.get("apps", [])) or "unknown"
    if stop_policy == "never" or service["manager"] == "none":
        why = "service.stop is never" if service["manager"] != "none" else "there is no service to stop"
        raise PreflightError(f"{gaps}; {why}. Memory is held by: {holders}",
                             hint="Free the GPU, lower gpu.min_free_mib, or allow `service.stop: if-needed`.")
    state = (report.get("service") or {}).get("active_state")
    if state != "active":
        raise PreflightError(f"{gaps}; the service {service['unit']} is {state or 'unknown'}, so stopping it "
                             f"frees nothing. Memory is held by: {holders}")
    return Decision(True, [gaps, f"will stop {service['unit']} and restore it afterwards"])
