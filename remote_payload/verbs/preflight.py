"""`preflight`: the host as a job would find it (its services, locks, GPUs, Python), touching nothing."""
from __future__ import annotations

import shutil
import sys

from ..contract import RUNNING_SERVICE_STATES, services_of
from ..host import engine, health, unit_stop
from ..host.answer import Fail
from ..host.gpu import GPU_QUERY, nvidia_smi, query_apps
from ..host.parsers import parse_gpu_csv
from ..host.systemd import Systemd
from ..supervision import ledger
from ..supervision.locks import lock_keys, probe_lock
from ..supervision.spec import check_job_id, read_spec_stdin
from ..supervision.startable import check_startable
from .launcher import slurm_launch

HEALTH_PROBE_S = 5.0  # one probe of the health URL at preflight, as long as each of the restore's probes


def cmd_preflight(args) -> dict:
    return preflight_report(args, read_spec_stdin(args.root, check_job_id(args.job_id) if args.job_id else None))


def preflight_report(args, spec: dict) -> dict:
    python = "%d.%d.%d" % sys.version_info[:3]
    if spec.get("launcher") == "slurm":
        return slurm_launch().preflight(python)
    check_startable(spec, args.root)  # before anything else: a job whose payload cannot start is refused
    found = [preflight_service(args.root, s) for s in services_of(spec)]
    several = {"services": found, "services_kept": spec.get("services_kept", [])} if "services" in spec else {}
    locks = [probe_lock(key) for key in lock_keys(spec)] + owed_elsewhere(args.root, found)
    return dict({"ok": True, "service": found[0] if found else None, "locks": locks, "python": python},
                **several, **preflight_gpus(spec))


def owed_elsewhere(root: str, found: list) -> list:
    """A unit that another login's job stopped and still owes, not running now: busy here, naming that job."""
    owed = []
    for service in found:
        entry = ledger.foreign_entry(root, service["unit"])
        if entry and service.get("active_state") not in RUNNING_SERVICE_STATES:
            key = "service-" + service["unit"]
            owed.append({"key": key, "held": True, "holder": dict(entry, key=key)})
    return owed


def preflight_gpus(spec: dict) -> dict:
    devices, smi = spec["gpu"]["devices"], shutil.which("nvidia-smi") is not None
    if not devices or not smi:
        return {"gpus": [], "apps": [], "nvidia_smi": smi}
    found = parse_gpu_csv(nvidia_smi(GPU_QUERY))
    wanted = set(devices)
    # host_gpus: every GPU nvidia-smi lists, so a refusal of a device it lacks can say which ones it has.
    return {"gpus": [g for g in found if g["index"] in wanted or g["uuid"] in wanted], "apps": query_apps(),
            "nvidia_smi": True, "host_gpus": [{"index": g["index"], "uuid": g["uuid"]} for g in found]}


def preflight_service(root: str, spec_service: dict) -> dict:
    """One service the job frees, as it is now: its state, the ledger's entry, what its engine offers."""
    unit = spec_service["unit"]
    ctl = Systemd(spec_service["scope"], spec_service["sudo"])
    service = dict(ctl.show(unit), manager="systemd", unit=unit, ledger=ledger.read_entry(root, unit))
    ctl.refuse_missing(unit, service["active_state"])
    refuse_unanswered_health(spec_service, service)
    if spec_service.get("free", "stop") != "stop":  # asked before anything is touched
        service["engine"] = engine.offers(spec_service)
    elif spec_service.get("stop", "never") != "never":  # admission says it when the job will stop the unit
        hint = unit_stop.slow_stop_hint(unit, unit_stop.stop_settings(ctl, unit))
        if hint:
            service["stop_hint"] = hint
    return service


def refuse_unanswered_health(spec_service: dict, found: dict) -> None:
    """A health URL that does not answer 2xx while the unit serves now (a wrong port or path) would be found
    only after the stop, health_timeout later. Asked of an active unit no runner job holds; any 2xx will do."""
    url = spec_service.get("health_url")
    if not url or spec_service.get("stop", "never") == "never" or found["active_state"] != "active" or found["ledger"]:
        return
    if not health.health_ok(url, HEALTH_PROBE_S):
        raise Fail("preflight-refused", "service.health_url %s does not answer 2xx while %s is active: the restore "
                   "after the stop would wait service.health_timeout for it, then fail" % (url, found["unit"]),
                   hint="Check its port and path (`curl -i URL` on the host); nothing was touched.")
