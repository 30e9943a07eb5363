"""May this job start on this host now, and will it stop the service: the one rule, applied to a preflight report.

The host's `submit` applies it; the controller applies the same function for `submit --dry-run`, and the
supervisor's own stop at start time uses `needs_stop`. Pure; the verdict is plain data that crosses the wire:

    {"refuse": {"code": "busy" | "preflight-refused", "message": …, "hint": …, "holder": {…}}}  (holder: busy only)
    {"start": True, "stop_service": bool, "notes": [str, …]}

A busy message names the lock and its holder without the "host busy: " the controller puts before it.
"""
from __future__ import annotations

from .contract import DEFAULTS, memory_verdict, normalize_unit, services_of

BUSY_HINT = "Wait for that job (`runner tail ID -f`), cancel it, or submit with --queue."
ENGINE_HINT = ("Start the engine with its memory API (SGLang: --enable-memory-saver; vLLM: --enable-sleep-mode and "
               "VLLM_SERVER_DEV_MODE=1), name where its key lives (service.api_key, service.admin_api_key), or use "
               "`service.free: stop`.")
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
        verdict = _admit(spec, report, queue)
    except _Refused as refused:
        return {"refuse": refused.verdict}
    if verdict["stop_service"]:
        verdict["notes"] += _stop_hints(spec, report)
    if queue:
        verdict["notes"] += _queued_notes(spec, report)
    return verdict


def _queued_notes(spec: dict, report: dict) -> list:
    """--queue behind another job: which job it waits for, and that a service it holds stopped may go down twice
    (its end starts it again; this job decides its own stop only then)."""
    held = {}  # type: dict
    for lock in report.get("locks", []):
        job_id = (lock.get("holder") or {}).get("job_id")
        if lock.get("held") and job_id != spec["job_id"]:
            held.setdefault(job_id or "?", []).append(lock["key"])
    notes = ["queued behind job %s (it holds %s): this job starts when it ends" % (job_id, ", ".join(keys))
             for job_id, keys in held.items()]
    for service, found in _services_with_reports(spec, report):
        holder = (found or {}).get("active_state") != "active" and _runner_holds_stopped(dict(report, service=found),
                                                                                         service["unit"])
        if holder:
            notes.append("%s stopped %s and starts it again when it ends; this job then decides its own stop, so %s "
                         "may be stopped a second time, after that restart" % (holder, service["unit"], service["unit"]))
    return notes


def _stop_hints(spec: dict, report: dict) -> list:
    """The host's warning for each service the job may stop that will be slow to stop (a hint, never a refusal)."""
    return ["warning: %s" % found["stop_hint"] for service, found in _services_with_reports(spec, report)
            if _policy(service) != "never" and isinstance(found, dict) and isinstance(found.get("stop_hint"), str)]


def needs_stop(policy: str, short: bool) -> bool:
    """The stop policy applied: `always` stops, `never` never does, `if-needed` stops when memory is short."""
    return policy == "always" or (policy == "if-needed" and short)


def never_stops(spec: dict) -> bool:
    """Whether the job stops no service whatever its host reports: each service it declares is `manager: none`
    or `stop: never` (defaults applied). A fleet starts such a host without a turn of its own."""
    services = spec["services"] if spec.get("services") is not None else [spec.get("service") or {}]
    return all(s.get("manager", DEFAULTS["service.manager"]) == "none"
               or s.get("stop", DEFAULTS["service.stop"]) == "never" for s in services)


def describe_holder(holder) -> str:
    """Whoever holds a lock, as the host named it: a runner job, another process, or a lock file nobody holds."""
    if not holder:
        return "an unknown process"
    who = " of %s (host.root %s)" % (holder["user"], holder.get("root") or "?") if holder.get("user") else ""
    if holder.get("job_id"):
        since = "" if holder.get("pid") else ", its stop not restored yet"
        return "job %s%s%s" % (holder["job_id"], who, " (supervisor pid %s)" % holder["pid"] if holder.get("pid")
                                 else since)
    if holder.get("pid"):
        return "pid %s of user %s (%s), not a runner job" % (holder["pid"], holder.get("user", "?"),
                                                               holder.get("command", "?"))
    return "a lock file user %s left (nobody holds it; that user, or root, removes it)" % holder.get("user", "?")


def _admit(spec: dict, report: dict, queue: bool) -> dict:
    """Over the job's own GPUs only, and only the services they meet (the wire spec lists just those)."""
    if not queue:
        _refuse_if_locked(report.get("locks", []), spec["job_id"])
    gpu, pairs = spec["gpu"], _services_with_reports(spec, report)
    for service, found in pairs:
        _refuse_if_engine_cannot(service, found, report)
    kept = _kept_note(report)
    if not gpu["devices"]:
        return _start(any(needs_stop(_policy(s), False) for s, _ in pairs), ["no GPUs requested: no memory check"]
                      + kept)
    short = _short_gpus(gpu, report)
    if not short:
        notes = ["GPU %s: %s MiB free >= %s MiB needed" % (g["index"], g["free_mib"], gpu["required_mib"])
                 for g in _selected(gpu, report)]
        return _start(any(needs_stop(_policy(s), False) for s, _ in pairs), notes + kept)
    holding = [(s, f) for s, f in pairs if _holds_any(s, short)]
    if not holding:  # no service of the job is on the short cards: nothing to stop there
        holding = [({"manager": "none"}, None)]
    verdicts = [_decide_short(short, _policy(s), s, dict(report, service=f), gpu["required_mib"], queue)
                for s, f in holding]
    notes = [n for v in verdicts for n in v["notes"]]
    return _start(any(v["stop_service"] for v in verdicts), list(dict.fromkeys(notes)) + kept)


def _services_with_reports(spec: dict, report: dict) -> list:
    """(the service's spec, the host's report on it) for each service the job frees (with several, those the
    report lists: the ones the job's GPUs meet)."""
    services = services_of(spec)
    if "services" not in report:  # one service: the report's
        return [(s, report.get("service")) for s in services[:1]]
    by_unit = {f.get("unit"): f for f in report["services"] or [] if isinstance(f, dict)}
    return [(s, by_unit[normalize_unit(s["unit"])]) for s in services if normalize_unit(s["unit"]) in by_unit]


def _policy(service: dict) -> str:
    return service.get("stop", "never") if service["manager"] != "none" else "never"


def _holds_any(service: dict, gpus: list) -> bool:
    """Whether the service is on one of these cards (a service that lists none is on every card)."""
    held = {str(g) for g in service.get("gpus") or []}
    return not held or any(str(g["index"]) in held or g.get("uuid") in held for g in gpus)


def _kept_note(report: dict) -> list:
    kept = report.get("services_kept") or []
    return ["%s keep%s serving: not on the job's GPUs" % (", ".join(kept), "s" if len(kept) == 1 else "")] \
        if kept else []


def _start(stop_service: bool, notes: list) -> dict:
    return {"start": True, "stop_service": stop_service, "notes": notes}


def _refuse_if_locked(locks: list, job_id: str) -> None:
    """A lock held by this very job id is a retried submit of a job already running, not a busy host."""
    for lock in locks:
        holder = lock.get("holder") or {}
        if lock.get("held") and holder.get("job_id") != job_id:
            raise _Refused("busy", "%s is held by %s" % (lock["key"], describe_holder(lock.get("holder"))),
                           BUSY_HINT, dict(holder, key=lock["key"]))


def _refuse_if_engine_cannot(service: dict, found, report: dict) -> None:
    """service.free sglang/vllm: the engine's answer to the host's probe. A unit that is not running, or that a
    runner job holds released, is judged by the memory rules instead."""
    engine = (found or {}).get("engine") or {}
    if not engine.get("error") or (found or {}).get("active_state") != "active" \
            or _runner_holds_stopped(dict(report, service=found), service["unit"]):
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
        listed = report.get("host_gpus", report.get("gpus", []))  # every GPU of the host, not the asked-for ones
        have = ", ".join("%s (%s)" % (g["index"], g.get("uuid", "?")) for g in listed) or "none"
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
        # decides the stop again when the locks are ours (the queued notes say so).
        return _start(False, [gaps])
    if state != "active":
        raise _Refused("preflight-refused", "%s; the service %s is %s, so stopping it frees nothing. Memory is held "
                       "by: %s" % (gaps, service["unit"], state or "unknown", holders))
    if service.get("free", "stop") != "stop":
        engine = (report.get("service") or {}).get("engine") or {}
        how = " %s %s" % (engine.get("version"), engine.get("sequence")) if engine.get("sequence") else ""
        return _start(True, [gaps, "will release GPU memory of %s through its %s API and resume it afterwards (the "
                                   "unit keeps running)%s" % (service["unit"], service["free"], how and ":" + how)])
    return _start(True, [gaps, "will stop %s and restore it afterwards" % service["unit"]])
