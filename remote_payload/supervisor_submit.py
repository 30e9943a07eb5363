"""The warm path's one round trip (issue 10): `submit` = preflight, then start, in one supervisor call.

The host starts the job only when nothing in its own preflight report could make the controller refuse it
(runner/preflight.decide would pass without stopping anything): no lock held by another job (unless
--queue), and every requested GPU found with enough free memory by contract.memory_verdict. Otherwise it
answers the report alone and the controller decides, explains and starts as before (a second call).
stdlib only; never imports the controller.
"""
from __future__ import annotations

try:  # imported as remote_payload.supervisor_submit (tests)
    from .contract import memory_verdict
    from .supervisor_host import Fail
except ImportError:  # run as a script: sys.path[0] is this directory
    from contract import memory_verdict
    from supervisor_host import Fail


def submit(args, spec: dict, preflight_report, start_job) -> dict:
    """The preflight report, and the start's answer when nothing in the report could refuse the job
    (`started`: false leaves the decision and the start to the controller). preflight_report and start_job
    are supervisor.py's own (`preflight` and `start` without reading stdin)."""
    try:
        report = preflight_report(args, spec)
    except Fail as exc:
        raise Fail(exc.code, str(exc), stage="preflight", **exc.extra)
    if not starts_without_asking(args.job_id, spec, report, args.queue):
        return {"ok": True, "started": False, "report": report}
    try:
        answer = start_job(args, spec)
    except Fail as exc:  # e.g. `exists`: the controller decides what that means from the report
        raise Fail(exc.code, str(exc), report=report, **exc.extra)
    return dict(answer, started=answer.get("ok", False), report=report)


def starts_without_asking(job_id: str, spec: dict, report: dict, queue: bool) -> bool:
    """Whether the controller's decision on `report` is sure to be "start" (preflight.decide cannot refuse)."""
    if not queue and any(lock.get("held") and (lock.get("holder") or {}).get("job_id") != job_id
                         for lock in report.get("locks", [])):
        return False
    gpu = spec["gpu"]
    if not gpu["devices"]:
        return True
    if not report.get("nvidia_smi"):
        return False
    found = {str(g["index"]): g for g in report.get("gpus", [])}
    found.update({g["uuid"]: g for g in report.get("gpus", []) if g.get("uuid")})
    selected = [found.get(str(device)) for device in gpu["devices"]]
    return all(g is not None and memory_verdict(g, gpu["required_mib"]) == "ok" for g in selected)
