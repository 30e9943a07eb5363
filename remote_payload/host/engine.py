"""Freeing the GPU through the serving engine's own HTTP API instead of stopping its unit.

    probe:    before anything is touched: the engine's release (its row in engine_releases.py, an unknown one
              refused) and whether it can release (SGLang: memory saver, pause mode, admin key; vLLM: sleep mode)
    release:  SGLang (engine_sglang.py) or vLLM (engine_vllm.py)
    resume:   give back what was released, then wait for the engine's health route
    downtime: the window's parts, the same for every method

The unit keeps running. Each step is recorded before it is asked for and again once answered (engine_api.py),
so a restorer knows what may be released; a release whose answer was never seen is not guessed at: the caller
restarts the unit. The record carries its release row, so a restorer undoes what that release did without
asking the engine which one it is. Any failure is an EngineError.
"""
from __future__ import annotations

import time

from ..contract import origin
from . import engine_sglang, engine_vllm
from .engine_api import Api, pending
from .engine_releases import UnknownRelease, choose, sequence
from .engine_sglang import DRAIN_TIMEOUT_S, NothingReleased
from .http_client import POLL_S, EngineError, exchange, wait_for

CALL_TIMEOUT_S = 30.0     # the probe before a release (its deadline; each call's is the caller's)
PROBE_S = 5.0             # the preflight's question to the engine
SETTLE_S = 2.0            # after a release, how long nvidia-smi may lag before the memory counts as still held
__all__ = ["DRAIN_TIMEOUT_S", "NothingReleased", "pending"]


class Unsupported(EngineError):
    """The server cannot free memory through its API; found before anything was touched."""


def api_url(service: dict) -> str:
    """service.api_url, else the origin of service.health_url (the host checked one is there)."""
    return (service.get("api_url") or origin(service.get("health_url") or "")).rstrip("/")


def new_record(service: dict, offers: dict) -> dict:
    """What is (or may be) released: JSON, kept in status.json and the host ledger. steps: in order, each
    {"step": pause|kv_cache|weights|sleep, "done": bool}; release: the release row it was done by."""
    return {"engine": service["free"], "api_url": api_url(service), "mode": offers.get("mode"),
            "release": offers["release"], "steps": [], "released_at": time.time(), "timings": {}}


# ── probe ─────────────────────────────────────────────────────────────────────────────────────────────

def probe(service: dict, deadline: float) -> dict:
    """What the engine offers, asked without touching it: raises Unsupported with the reason."""
    api = Api(api_url(service), service)
    try:
        return probe_sglang(api, service, deadline) if service["free"] == "sglang" else probe_vllm(api, deadline)
    except UnknownRelease as exc:
        raise Unsupported(str(exc)) from exc


def offers(service: dict) -> dict:
    """probe's answer for the preflight report: what the engine offers, or {"error": why} (never raises)."""
    try:
        return probe(service, time.monotonic() + PROBE_S)
    except EngineError as exc:
        return {"engine": service["free"], "error": str(exc)}


def probe_sglang(api: Api, service: dict, deadline: float) -> dict:
    status, info = api.call("GET", "/server_info", deadline, admin=False)
    if status != 200 or not isinstance(info, dict):
        raise Unsupported("%s/server_info answered %d%s" % (api.base, status, ": not an SGLang server runner supports"
                                                            if status == 404 else ": %s" % (info,)))
    row = choose("sglang", info.get("version"))
    if not info.get("enable_memory_saver"):
        raise Unsupported("the SGLang server at %s runs without --enable-memory-saver: a release would free "
                          "nothing" % api.base)
    mode = service.get("pause_mode") or row["modes"][0]
    problem = engine_sglang.mode_problem(row, mode)
    if problem:
        raise Unsupported(problem)
    api.call("GET", "/hicache/storage-backend", deadline)  # a read-only admin route: its key is checked here
    found = {"engine": "sglang", "version": row["version"], "release": row, "mode": mode,
             "weights_cpu_backup": bool(info.get("enable_weights_cpu_backup"))}
    return dict(found, sequence=sequence(found))


def probe_vllm(api: Api, deadline: float) -> dict:
    status, answer = api.call("GET", "/version", deadline, admin=False)
    if status != 200 or not isinstance(answer, dict):
        raise Unsupported("%s/version answered %d: not a vLLM server runner supports" % (api.base, status))
    row = choose("vllm", answer.get("version"))
    status, answer = api.call("GET", "/is_sleeping", deadline)
    if status == 404:
        raise Unsupported("%s/is_sleeping answered 404: start vLLM with VLLM_SERVER_DEV_MODE=1 (its sleep routes are "
                          "dev routes) and --enable-sleep-mode" % api.base)
    if status != 200 or not isinstance(answer, dict) or "is_sleeping" not in answer:
        raise Unsupported("%s/is_sleeping answered %d: %s" % (api.base, status, answer))
    if answer["is_sleeping"]:
        raise Unsupported("the vLLM server at %s is asleep or paused already (someone else put it so)" % api.base)
    status, info = api.call("GET", "/server_info", deadline)
    text = str(info) if status == 200 else ""
    if "enable_sleep_mode" in text and "enable_sleep_mode=True" not in text and "'enable_sleep_mode': True" not in text:
        raise Unsupported("the vLLM server at %s runs without --enable-sleep-mode" % api.base)
    found = {"engine": "vllm", "version": row["version"], "release": row, "mode": None}
    return dict(found, sequence=sequence(found))


# ── release ───────────────────────────────────────────────────────────────────────────────────────────

def release(service: dict, need_mib: int, gpu_free_fn, deadline: float, save=lambda record: None,
            offers=None) -> dict:
    """Free the engine's GPU memory; returns the record (also handed to `save` at every step).
    gpu_free_fn(): the least free MiB over the job's GPUs now (None: unknown, counts as short)."""
    offers = offers or probe(service, deadline)
    record = new_record(service, offers)
    api = Api(record["api_url"], service)
    began = time.monotonic()
    if service["free"] == "sglang":
        engine_sglang.release(api, record, offers, need_mib, gpu_free_fn, deadline, save, service, enough)
    else:
        engine_vllm.sleep(api, record, deadline, save)
    record["timings"]["release_s"] = round(time.monotonic() - began, 3)
    save(record)
    return record


def enough(need_mib: int, gpu_free_fn, deadline: float) -> bool:
    """Whether need_mib is free, giving nvidia-smi SETTLE_S to see a release that just happened."""
    settle = min(deadline, time.monotonic() + SETTLE_S)
    while True:
        free = gpu_free_fn()
        if free is not None and free >= need_mib:
            return True
        if time.monotonic() + POLL_S >= settle:
            return False
        time.sleep(POLL_S)


# ── resume ────────────────────────────────────────────────────────────────────────────────────────────

def resume(record: dict, service: dict, deadline: float) -> dict:
    """Give back what the record says was released, then wait until the engine serves; returns the timings.
    EngineError (the caller then restarts the unit) when the API does not answer, a step fails, or the record
    has a release whose answer was never seen."""
    began = time.monotonic()
    api = Api(record["api_url"], service)
    if record["engine"] == "sglang":
        engine_sglang.resume(api, record, deadline)
        health = record["api_url"] + "/health_generate"
    else:
        engine_vllm.wake(api, record, deadline)
        health = service.get("health_url") or record["api_url"] + "/health"
    resumed, served_at = time.monotonic(), time.time()
    wait_for(lambda: exchange("GET", health, deadline)[0] == 200, deadline, "%s to answer 200" % health)
    timings = {"resume_s": round(resumed - began, 3), "health_s": round(time.monotonic() - resumed, 3)}
    if record.get("paused_at") is not None:
        timings["hold_s"] = round(served_at - record["paused_at"], 3)
    return timings


def describe(record: dict) -> str:
    """"kv_cache, weights released through SGLang 0.5.21's API (retract)" and the like, for messages."""
    done = [s["step"] for s in record.get("steps", []) if s.get("done") and s["step"] not in ("pause", "sleep")]
    version = (record.get("release") or {}).get("version")
    if record["engine"] == "vllm":
        asleep = any(s["step"] == "sleep" and s.get("done") for s in record.get("steps", []))
        return "vLLM%s %s" % (" " + version if version else "", "put to sleep (level 1)" if asleep else
                              "asked to sleep")
    return "%s released through SGLang%s's API (%s)" % (", ".join(done) or "nothing",
                                                        " " + version if version else "", record.get("mode"))


# ── downtime: the same parts for every method ─────────────────────────────────────────────────────────

def downtime(service: dict, gpu, restore_began: float, restored_at: float, healthy: bool) -> dict:
    """"Not serving" from the stop/pause/sleep to healthy again (None while not healthy), and its parts, in
    wall-clock seconds (None for a part this job did not see: an adopted stop). An engine's window starts at
    its first hold: one that never paused held no client (0 s, whatever the restore did)."""
    released = service.get("released") or {}
    stopped = released.get("paused_at") if released else service.get("stopped_at")
    freed, resumed, drain_s = service.get("freed_at"), service.get("resumed") or {}, (gpu or {}).get("drained_after_s")

    def span(start, end):
        return round(end - start, 3) if start is not None and end is not None else None
    payload_end = restore_began - (drain_s or 0.0)
    never_held = bool(released) and stopped is None
    parts = {"method": released.get("engine", "stop"),
             "not_serving_s": 0.0 if never_held else span(stopped, restored_at) if healthy else None,
             "release_s": span(service.get("stopped_at"), freed), "drain_s": drain_s,
             "payload_s": span(freed, payload_end), "resume_s": resumed.get("resume_s"),
             "health_s": resumed.get("health_s")}
    if released.get("clients") is not None:
        parts.update(pause_mode=released.get("mode"), clients=dict(released["clients"],
                                                                   hold_s=0.0 if never_held else resumed.get("hold_s")))
    return parts
