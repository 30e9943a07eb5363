"""The supervisor's own check of what it is given: the spec JSON on stdin, job ids, unit names, ROOT.

The host never trusts the controller's validation: it checks again with contract.py's rules and defaults, so
both sides refuse and default alike. A problem is a `Fail` (`bad-spec` for the spec, `bad-args` for argv).
The rules of a spec's parts (engine, sweep, Slurm) are imported where used: `logs`, `status` and `cancel`
check only ids.
"""
from __future__ import annotations

import json
import os
import re
import stat
import sys

from .. import contract
from ..host.answer import Fail
from ..host.gpu import query_gpus
from .files import JobPaths

DEFAULTS = contract.DEFAULTS


def _valid(value, problem, code: str, what: str):
    if problem:
        raise Fail(code, "invalid %s: %s" % (what, problem))
    return value


def check_job_id(job_id) -> str:
    return _valid(job_id, contract.job_id_problem(job_id), "bad-args", "job id")


def check_unit(unit) -> str:
    """A systemd unit name by contract.unit_problem; `.service` added as systemctl would."""
    return contract.normalize_unit(_valid(unit, contract.unit_problem(unit), "bad-spec", "systemd unit name"))


def check_root(root) -> str:
    """--root as the controller sent it, before it is expanded (BOOT passes it expanded, so absolute)."""
    return _valid(root, contract.root_problem(root), "bad-args", "--root")


def check_root_safe(root: str, here: str) -> None:
    """ROOT, its jobs dir and the payload dir this code runs from must be ours alone: anyone else who can write
    there can replace the supervisor (run as root through the guard timer)."""
    for path in (root, os.path.join(root, "jobs"), here):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        # owned by us or by root (like sshd's StrictModes); root itself runs the login's files by design
        owner_ok = st.st_uid in (os.geteuid(), 0) or os.geteuid() == 0
        if stat.S_ISLNK(st.st_mode) or not owner_ok or st.st_mode & 0o022:
            raise Fail("unsafe-root", "%s is writable by others, a link, or owned by neither the login user (uid %d) nor root: "
                       "chmod go-w it, or choose another host.root" % (path, os.geteuid()))


def check_health_url(url, code: str = "bad-spec"):
    if url is not None and not (isinstance(url, str) and re.match(r"https?://[^\s]+$", url)):
        raise Fail(code, "the health URL must be an http(s) URL")
    return url


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise Fail("bad-spec", message)


def _rule(problem) -> None:
    if problem:
        raise Fail("bad-spec", problem)


def _number(value, field: str, minimum: float = 0.0) -> float:
    _need(isinstance(value, (int, float)) and not isinstance(value, bool) and value >= minimum,
          "%s must be a number >= %s, got %r" % (field, minimum, value))
    return float(value)


def _text(value, field: str) -> str:
    _need(isinstance(value, str) and value != "" and "\0" not in value, "%s must be a non-empty string" % field)
    return value


def _default(raw: dict, field: str):
    """raw's value for `section.key`, else the contract's default for it."""
    return raw.get(field.split(".", 1)[1], DEFAULTS[field])


def check_service(raw) -> dict:
    _need(isinstance(raw, dict), "service must be an object")
    manager = _default(raw, "service.manager")
    if manager == "none":
        return {"manager": "none"}
    _need(manager in contract.SERVICE_MANAGERS, "service.manager must be systemd or none, got %r" % (manager,))
    scope, stop = _default(raw, "service.scope"), _default(raw, "service.stop")
    _need(scope in contract.SERVICE_SCOPES, "service.scope must be system or user")
    _need(stop in contract.STOP_POLICIES, "service.stop must be always, if-needed or never")
    sudo = _default(raw, "service.sudo")
    _need(isinstance(sudo, bool), "service.sudo must be true or false")
    _need(not (scope == "user" and sudo), contract.USER_SCOPE_SUDO)
    service = {"manager": "systemd", "unit": check_unit(raw.get("unit")), "scope": scope, "stop": stop,
               "health_url": check_health_url(raw.get("health_url")),
               "health_timeout": _number(_default(raw, "service.health_timeout"), "service.health_timeout"),
               "sudo": sudo}
    service.update(check_free(raw, service["health_url"]))
    gpus = raw.get("gpus", list(DEFAULTS["service.gpus"]))
    _need(isinstance(gpus, list), "service.gpus must be a list")
    for gpu in gpus:
        _rule(contract.device_problem(gpu))
    if gpus:  # none listed: every GPU, the service section as it was
        service["gpus"] = [str(g) for g in gpus]
    return service


def check_services(raw: dict) -> list:
    """The host's services as declared: `services` (a list of service sections) or the one `service`; each
    unit once. Only systemd services are listed (manager none declares nothing)."""
    _need(raw.get("service") is None or raw.get("services") is None, "give `service` or `services`, not both")
    listed = raw.get("services")
    if listed is None:
        listed = [raw.get("service") or {"manager": "none"}]
    _need(isinstance(listed, list), "services must be a list of service sections")
    services = [s for s in (check_service(item) for item in listed) if s["manager"] == "systemd"]
    units = [s["unit"] for s in services]
    twice = sorted(set(u for u in units if units.count(u) > 1))
    _need(not twice, "services: %s listed twice" % ", ".join(twice))
    return services


def select_services(services: list, devices: list) -> tuple:
    """(the services the job frees, the units left serving): by their GPUs as the spec says (gpus_meet)."""
    if not devices or all(not s.get("gpus") for s in services):
        return services, []
    job = _indices(devices)
    met = [s for s in services if contract.gpus_meet(job, _indices(s.get("gpus") or []))]
    return met, [s["unit"] for s in services if s not in met]


def _indices(names: list) -> list:
    """Cards by index; a UUID through nvidia-smi (kept as given when it cannot say: the drain reports that)."""
    if all(contract.GPU_INDEX_RE.fullmatch(n) for n in names):
        return [str(int(n)) for n in names]
    try:
        return [str(g["index"]) for g in query_gpus(names)]
    except (Fail, ValueError):
        return list(names)


def check_free(raw: dict, health_url) -> dict:
    """service.free and its engine keys; nothing for `stop` (the service section as it was)."""
    from ..host.engine import api_url

    free = raw.get("free", "stop")
    _need(free in contract.FREE_METHODS, "service.free must be stop, sglang or vllm, got %r" % (free,))
    mode, url = raw.get("pause_mode"), check_health_url(raw.get("api_url"))
    bound, fallback = raw.get("drain_timeout"), raw.get("drain_fallback")
    keys = {name: raw.get(name) for name in contract.KEY_FIELDS if raw.get(name) is not None}
    for name, value in keys.items():
        _rule(contract.key_ref_problem(name, value))
    if free == "stop":
        _need(url is None and mode is None and bound is None and fallback is None and not keys,
              "service.api_url, pause_mode, drain_timeout, drain_fallback, api_key and admin_api_key go with free "
              "sglang or vllm")
        return {}
    _need(mode is None or (free == "sglang" and mode in contract.PAUSE_MODES),
          "service.pause_mode must be null, %s, and only with free sglang" % ", ".join(contract.PAUSE_MODES))
    _need(bound is None or free == "sglang", "service.drain_timeout goes with free sglang")
    _need(fallback is None or (free == "sglang" and mode in (None, "drain") and fallback in contract.DRAIN_FALLBACKS),
          "service.drain_fallback must be null, %s, and only with free sglang's drain" % ", ".join(contract.DRAIN_FALLBACKS))
    _need(url is not None or health_url is not None, "service.free %s needs api_url or health_url" % free)
    checked = dict(keys, free=free, api_url=api_url({"api_url": url, "health_url": health_url}), pause_mode=mode)
    if bound is not None:
        bound = _number(bound, "service.drain_timeout")
        _need(bound <= contract.MAX_DRAIN_TIMEOUT_S, "service.drain_timeout is at most %.0f s" % contract.MAX_DRAIN_TIMEOUT_S)
        checked["drain_timeout"] = bound
    if fallback is not None:
        checked["drain_fallback"] = fallback
    return checked


def check_gpu(raw) -> dict:
    raw = raw or {}
    _need(isinstance(raw, dict), "gpu must be an object")
    devices = raw.get("devices", [])
    _need(isinstance(devices, list), "gpu.devices must be a list")
    for device in devices:
        _rule(contract.device_problem(device))
    required = _default(raw, "gpu.required_mib")
    _need(isinstance(required, int) and not isinstance(required, bool) and required >= 0,
          "gpu.required_mib must be an integer >= 0")
    return {"devices": [str(d) for d in devices], "required_mib": required,
            "drain_timeout": _number(_default(raw, "gpu.drain_timeout"), "gpu.drain_timeout")}


BUNDLE_RE = re.compile(r"[0-9a-f]{16}$")


def check_bundle(bundle) -> str:
    """The payload bundle's digest: its dir is ROOT/payloads/<digest>/."""
    _need(isinstance(bundle, str) and BUNDLE_RE.match(bundle) is not None,
          "payload.bundle must name the uploaded payload bundle (16 hex digits), got %.40r" % (bundle,))
    return bundle


def locate_payload(spec: dict, root: str) -> dict:
    """A script payload's file, ROOT/payloads/<bundle>/<script>, recorded as payload.path: `payload-missing`
    (exit 42: the controller uploads, then calls again) while the bundle is not there."""
    payload = spec["payload"]
    if payload["script"] is None:
        return spec
    base = os.path.join(root, "payloads")
    here = os.path.join(base, payload["bundle"])
    if not os.path.isdir(here):  # `kept`: what a cut upload left of it, which the next one need not send
        from ..host.unpack import kept, stage_of  # an upload's code: only a host without the bundle needs it

        raise Fail("payload-missing", "the payload bundle %s is not on the host" % payload["bundle"],
                   exit_status=contract.EXIT_PAYLOAD_MISSING, kept=kept(stage_of(root, "payloads/" + payload["bundle"])))
    check_root_safe(base, here)
    path = os.path.join(here, payload["script"])
    _need(os.path.isfile(path), "payload.script %r is not in the uploaded payload bundle" % payload["script"])
    return dict(spec, payload=dict(payload, path=path))


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(a, str) and "\0" not in a for a in value)


def check_payload(raw) -> dict:
    _need(isinstance(raw, dict), "payload must be an object")
    script, command = raw.get("script"), raw.get("command")
    _need((script is None) != (command is None), "payload needs exactly one of script and command")
    env = raw.get("env") or {}
    _need(isinstance(env, dict), "payload.env must be an object")
    for key, value in env.items():
        _rule(contract.env_key_problem(key))
        _need(isinstance(value, str) and "\0" not in value, "payload.env.%s must be a string without NUL" % key)
    args = raw.get("args") or []
    _need(_strings(args), "payload.args must be a list of strings")
    prepare = raw.get("prepare")
    _need(prepare is None or (_strings(prepare) and (script is not None or bool(prepare))),
          "payload.prepare must be null or a list of strings (a non-empty command for a command payload)")
    prepare = None if prepare is None else list(prepare)
    staged = raw.get("staged", False)
    _need(isinstance(staged, bool), "payload.staged must be true or false")
    user = raw.get("user")
    if user is not None:
        _rule(contract.payload_user_problem(user))
    how = dict({"staged": staged}, **({"user": user} if user is not None else {}))  # how it is launched
    if command is not None:
        _need(_strings(command) and bool(command), "payload.command must be a non-empty list of strings")
        return dict({"command": list(command), "script": None, "python": None, "args": [], "env": dict(env),
                     "prepare": prepare}, **how)
    _rule(contract.script_problem(script))
    return dict({"command": None, "script": script, "bundle": check_bundle(raw.get("bundle")),
                 "python": _text(_default(raw, "payload.python"), "payload.python"), "args": list(args),
                 "env": dict(env), "prepare": prepare}, **how)


def check_spec(raw, job_id=None) -> dict:
    """The normalised spec; job_id (from argv) must agree with the spec's own when both are given."""
    _need(isinstance(raw, dict), "the spec must be a JSON object")
    if job_id is None:
        job_id = raw.get("job_id") or "preflight"
    _need(raw.get("job_id", job_id) == job_id, "spec job_id %r differs from --job-id" % (raw.get("job_id"),))
    limits = raw.get("limits") or {}
    _need(isinstance(limits, dict), "limits must be an object")
    name = raw.get("name", job_id)
    _need(isinstance(name, str) and len(name) <= 1000, "name must be a string")
    gpu = check_gpu(raw.get("gpu"))
    services, kept = select_services(check_services(raw), gpu["devices"])
    spec = {"name": name, "job_id": job_id, "service": services[0] if services else {"manager": "none"},
            "gpu": gpu, "payload": check_payload(raw.get("payload")),
            "limits": {key: _limit(limits, key, least) for key, least in LIMIT_MINIMUMS.items()}}
    if len(services) > 1 or kept:  # one service on every GPU: the spec as it was
        spec.update(services=services, services_kept=kept)
    spec.update(check_launcher(raw, spec))
    if raw.get("sweep") is not None:
        spec["sweep"] = check_sweep(raw["sweep"], spec)
    return spec


LIMIT_MINIMUMS = {"max_runtime": 0.001, "grace": 0.0, "prepare_timeout": 0.001, "queue_timeout": 0.0,
                  "stage_timeout": 0.001, "max_downtime": 0.001}


def _limit(limits: dict, key: str, least: float):
    value = _default(limits, "limits." + key)
    return None if value is None and key == "max_downtime" else _number(value, "limits." + key, least)


def check_sweep(raw, spec: dict) -> dict:
    """The variants as the controller expanded them: each its label args and argv (payload_argv's args)."""
    from ..sweep import MAX_VARIANTS, slot_problem, slots

    _need(isinstance(raw, dict) and isinstance(raw.get("variants"), list) and raw["variants"],
          "sweep.variants must be a non-empty list")
    _need(len(raw["variants"]) <= MAX_VARIANTS, "sweep.variants: at most %d" % MAX_VARIANTS)
    _need(isinstance(raw.get("fail_fast", False), bool), "sweep.fail_fast must be true or false")
    _need(not spec["payload"]["staged"], "payload.staged goes without a sweep: the variants run one after another "
          "in the window, none of them staged")
    for variant in raw["variants"]:
        _need(isinstance(variant, dict) and isinstance(variant.get("args"), dict) and _strings(variant.get("argv")),
              "each sweep variant needs args (an object) and argv (a list of strings)")
    sweep = {"fail_fast": raw.get("fail_fast", False),
             "variants": [{"args": dict(v["args"]), "argv": list(v["argv"])} for v in raw["variants"]]}
    per_variant = raw.get("gpus_per_variant")
    if per_variant is not None:  # side by side, each variant on its own slot of the devices
        _need(spec.get("launcher", "ssh") == "ssh", "sweep.gpus_per_variant is for launcher ssh (Slurm hands "
              "out the GPUs: sweep.max_parallel)")
        _rule(slot_problem(spec["gpu"]["devices"], per_variant))
        sweep["gpus_per_variant"] = per_variant
    sweep["slots"] = slots(spec["gpu"]["devices"], per_variant)
    if spec.get("launcher", "ssh") == "slurm":  # one job array: `--array=0-(N-1)%max_parallel`
        k = raw.get("max_parallel")
        _need(isinstance(k, int) and not isinstance(k, bool) and k >= 1,
              "sweep.max_parallel must be a whole number >= 1 with launcher slurm; got %r" % (k,))
        sweep["max_parallel"] = k
    else:
        _need(raw.get("max_parallel") is None, "sweep.max_parallel is for launcher slurm")
    return sweep


def variant_rounds(spec: dict) -> int:
    """How many variants run one after another at most (ceil(n / slots)): the factor of the time bounds."""
    from ..sweep import rounds

    sweep = spec.get("sweep") or {}
    return rounds(len(sweep.get("variants") or [None]), len(sweep.get("slots") or [None]))


def check_launcher(raw: dict, spec: dict) -> dict:
    """`launcher: slurm` with its `slurm` section (slurm/batch.py's rules), or nothing for an ssh job."""
    from ..slurm.batch import MAX_DOWNTIME_ON_SLURM, setup_seconds, slurm_problem, time_problem

    launcher = raw.get("launcher", "ssh")
    _need(launcher in contract.LAUNCHERS, "launcher must be ssh or slurm, got %r" % (launcher,))
    if launcher == "ssh":
        _need(raw.get("slurm") is None, "a slurm section needs launcher slurm")
        return {}
    slurm = raw.get("slurm")
    if not isinstance(slurm, dict):
        raise Fail("bad-spec", "launcher slurm needs a slurm object")
    _need(spec["service"]["manager"] == "none", "launcher slurm needs service.manager none (Slurm owns the GPUs)")
    _need(not spec["gpu"]["devices"], "launcher slurm takes no gpu.devices (Slurm hands them out)")
    _need(spec["limits"]["max_downtime"] is None, MAX_DOWNTIME_ON_SLURM)
    _rule(slurm_problem(slurm))
    minutes = slurm.get("time_min")
    if not (isinstance(minutes, int) and not isinstance(minutes, bool) and minutes >= 1):
        raise Fail("bad-spec", "slurm.time_min must be a whole number of minutes >= 1")
    _rule(time_problem(minutes, spec["limits"]["max_runtime"], spec["limits"]["grace"],
                       setup_seconds(spec["limits"], spec["payload"])))
    return {"launcher": "slurm", "slurm": dict(slurm)}


def read_spec_stdin(root: str, job_id=None, need_job_id: bool = False) -> dict:
    """The spec on stdin, checked, its script located; need_job_id: the spec names its job if argv does not."""
    try:
        raw = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    except ValueError as exc:
        raise Fail("bad-spec", "stdin is not a JSON spec: %s" % exc) from exc
    if need_job_id and job_id is None and not (isinstance(raw, dict) and raw.get("job_id")):
        raise Fail("bad-args", "no job id: neither --job-id nor the spec's job_id")
    return locate_payload(check_spec(raw, job_id), root)


def read_job_ids_stdin() -> list:
    """`--ids-on-stdin` (status, gc): a JSON list of job ids (a list of any length never goes through argv)."""
    try:
        ids = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    except ValueError as exc:
        raise Fail("bad-args", "stdin is not a JSON list of job ids: %s" % exc) from exc
    if not isinstance(ids, list) or not all(isinstance(job_id, str) for job_id in ids):
        raise Fail("bad-args", "stdin is not a JSON list of job ids")
    return ids


def job_paths(args) -> JobPaths:
    return existing_job(args.root, args.job_id)


def existing_job(root: str, job_id: str) -> JobPaths:
    """The paths of a job this host has; `unknown-job` otherwise."""
    paths = JobPaths(root, check_job_id(job_id))
    if not os.path.isdir(paths.dir):
        raise Fail("unknown-job", "no job %s on this host" % job_id, job_id=job_id)
    return paths
