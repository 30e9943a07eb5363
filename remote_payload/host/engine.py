"""Freeing the GPU through the serving engine's own HTTP API instead of stopping its unit.

    probe:    before anything is touched, the engine says it can (SGLang: /get_server_info has
              enable_memory_saver; vLLM: the dev-mode routes answer and sleep mode is on)
    release:  SGLang: drain (default) or abort → release kv_cache → enough free? else release weights (only
              with the weights' CPU backup) · vLLM: /sleep?level=1 → /is_sleeping
    drain:    SGLang serves on while its scheduler still has requests; once it says it is idle, an in-place
              pause closes admission (it aborts nothing), SGLang confirms it is still idle, and only then is
              memory released; a request that slipped in before the pause is let finish and the wait goes on,
              at most service.drain_timeout: past it nothing is released (the job ends, the service serving),
              unless service.drain_fallback is abort: then the requests still in flight are aborted and the
              release goes on
    resume:   SGLang: resume what was released, last first → continue generation → /health_generate
              · vLLM: /wake_up → /is_sleeping false → /health
    restore_released: every restorer's way back (resume, else restart the unit); downtime: the window's parts

The unit keeps running (its MainPID does not change). Each step is handed to `record` *before* it is asked
for and again once it answered, so a restorer that reads the record (the supervisor, the guard, the
ledger's next job, `restore`) knows what may be released: a step whose answer was never seen is "pending",
and `resume` refuses to guess about it (`EngineError`): the caller restarts the unit instead.

An SGLang engine that gets a release while any request runs or waits aborts its whole server process
(release_memory_occupation asserts the scheduler is fully idle), so memory is released only once SGLang
itself said it is idle (drain), or after its abort-mode pause, which returns every request it holds. SGLang
0.5.x has no call that stops admission while the running requests go on: its pause either aborts them (abort)
or freezes them in the scheduler (in_place; retract puts them back in its queue); both of the latter keep it
from being idle, so a release after them with requests in flight kills the server: those two modes are
refused before anything is touched (contract.REFUSED_PAUSE_MODES); the drain uses in_place only once SGLang
said it is idle. SGLang without --enable-memory-saver answers every release with 200 and frees nothing (its
memory saver is a no-op then): only /get_server_info tells, so `probe` reads it. Weights released without
--enable-weights-cpu-backup come back as uninitialised memory; they are never released then. Every HTTP call
goes through host/http_client.py (bounded as a whole by the caller's deadline, its body capped, no redirect followed;
any failure of it is an EngineError: the caller restarts the unit); the unit's health wait is host/health.py's.
Stdlib only; imports contract.py and host/.
"""
from __future__ import annotations

import json
import time

from ..contract import REFUSED_PAUSE_MODES, origin
from .answer import Fail
from .health import wait_healthy
from .http_client import POLL_S, EngineError, call, exchange, expect_ok, wait_for

DRAIN_TIMEOUT_S = 60.0    # service.drain_timeout: how long the drain may wait for SGLang to be idle
DRAIN_WAIT_S = 10.0       # one /flush_cache?timeout= wait: SGLang answers as soon as its scheduler is idle
DRAIN_SETTLE_S = 0.2      # after the in-place pause: a request that passed SGLang's gate just before it reaches
                          # the scheduler (its tokenization) before the idle check asks
KV_CACHE, WEIGHTS = "kv_cache", "weights"
CALL_TIMEOUT_S = 30.0     # the probe before a release (its deadline; each call's is the caller's)
PROBE_S = 5.0             # the preflight's question to the engine
SETTLE_S = 2.0            # after a release, how long nvidia-smi may lag before the memory counts as still held


class Unsupported(EngineError):
    """The server cannot free memory through its API; found before anything was touched."""


def api_url(service: dict) -> str:
    """service.api_url, else the origin of service.health_url (the host checked one is there)."""
    url = service.get("api_url") or origin(service.get("health_url") or "")
    return url.rstrip("/")


# ── the released record ───────────────────────────────────────────────────────────────────────────────

def new_record(service: dict) -> dict:
    """What is (or may be) released: JSON, kept in status.json and the host ledger. steps: in order,
    each {"step": pause|kv_cache|weights|sleep, "done": bool}; done false = asked, answer not seen."""
    mode = (service.get("pause_mode") or "drain") if service["free"] == "sglang" else None
    return {"engine": service["free"], "api_url": api_url(service), "mode": mode,
            "steps": [], "released_at": time.time(), "timings": {}}


def begin(record: dict, name: str, save) -> dict:
    record["steps"].append({"step": name, "done": False})
    save(record)
    return record["steps"][-1]


def finish(record: dict, entry: dict, save) -> None:
    entry["done"] = True
    save(record)


def pending(record: dict) -> list:
    return [s["step"] for s in record.get("steps", []) if not s.get("done")]


# ── probe ─────────────────────────────────────────────────────────────────────────────────────────────

def probe(service: dict, deadline: float) -> dict:
    """What the engine offers, asked without touching it: raises Unsupported with the reason."""
    base = api_url(service)
    if service["free"] == "sglang":
        return probe_sglang(base, deadline)
    return probe_vllm(base, deadline)


def offers(service: dict) -> dict:
    """probe's answer for the preflight report: what the engine offers, or {"error": why} (never raises)."""
    try:
        return probe(service, time.monotonic() + PROBE_S)
    except EngineError as exc:
        return {"engine": service["free"], "error": str(exc)}


def probe_sglang(base: str, deadline: float) -> dict:
    # 0.5.x answers /get_server_info; later releases keep it as a deprecated alias of /server_info
    for route in ("/get_server_info", "/server_info"):
        status, info = call("GET", base + route, deadline)
        if status != 404:
            break
    if status == 404 or not isinstance(info, dict):
        raise Unsupported("%s%s answered %d: not an SGLang server" % (base, route, status))
    if status != 200:
        raise Unsupported("%s%s answered %d: %s" % (base, route, status, info))
    if not info.get("enable_memory_saver"):
        raise Unsupported("the SGLang server at %s runs without --enable-memory-saver: a release would free "
                          "nothing" % base)
    return {"engine": "sglang", "version": info.get("version"),
            "weights_cpu_backup": bool(info.get("enable_weights_cpu_backup"))}


def probe_vllm(base: str, deadline: float) -> dict:
    status, answer = call("GET", base + "/is_sleeping", deadline)
    if status == 404:
        raise Unsupported("%s/is_sleeping answered 404: start vLLM with VLLM_SERVER_DEV_MODE=1 and "
                          "--enable-sleep-mode" % base)
    if status != 200 or not isinstance(answer, dict) or "is_sleeping" not in answer:
        raise Unsupported("%s/is_sleeping answered %d: %s" % (base, status, answer))
    if answer["is_sleeping"]:
        raise Unsupported("the vLLM server at %s is asleep already (someone else put it to sleep)" % base)
    status, info = call("GET", base + "/server_info", deadline)
    text = json.dumps(info) if status == 200 else ""
    if "enable_sleep_mode" in text and "enable_sleep_mode=True" not in text \
            and '"enable_sleep_mode": true' not in text:
        raise Unsupported("the vLLM server at %s runs without --enable-sleep-mode" % base)
    return {"engine": "vllm"}


# ── release ───────────────────────────────────────────────────────────────────────────────────────────

def release(service: dict, need_mib: int, gpu_free_fn, deadline: float, save=lambda record: None,
            offers=None) -> dict:
    """Free the engine's GPU memory; returns the record (also handed to `save` at every step).
    gpu_free_fn(): the least free MiB over the job's GPUs now (None: unknown, counts as short);
    offers: probe's answer when the caller asked already."""
    offers = offers or probe(service, deadline)
    record = new_record(service)
    began = time.monotonic()
    if service["free"] == "sglang":
        bound = service.get("drain_timeout") or DRAIN_TIMEOUT_S
        release_sglang(record, offers, need_mib, gpu_free_fn, deadline, save, bound,
                       service.get("drain_fallback") or "skip")
    else:
        sleep_vllm(record, deadline, save)
    record["timings"]["release_s"] = round(time.monotonic() - began, 3)
    save(record)
    return record


def release_sglang(record: dict, offers: dict, need_mib: int, gpu_free_fn, deadline: float, save,
                   bound: float = DRAIN_TIMEOUT_S, fallback: str = "skip") -> None:
    if record["mode"] in REFUSED_PAUSE_MODES:  # the preflight refuses them; a spec that got here anyway touches nothing
        raise EngineError("service.pause_mode %s: %s" % (record["mode"], REFUSED_PAUSE_MODES[record["mode"]]))
    if record["mode"] == "drain":
        try:
            drain_sglang(record, deadline, bound, save)
        except DrainTimeout:
            if fallback != "abort":
                raise
            abort_all(record, deadline, save, "abort")  # the operator's choice (drain_fallback: abort): the rest aborted
            record["clients"]["drain_timed_out_s"] = record["drain"]["waited_s"]
            record["drain"]["fallback"] = "abort"
            save(record)
    else:
        abort_all(record, deadline, save)
    release_tag(record, KV_CACHE, deadline, save)
    if enough(need_mib, gpu_free_fn, deadline):
        return
    if not offers["weights_cpu_backup"]:
        record["short_after"] = KV_CACHE
        save(record)
        return  # the drain names the shortfall; weights without their CPU backup would come back garbage
    release_tag(record, WEIGHTS, deadline, save)


def abort_all(record: dict, deadline: float, save, mode: str = "") -> None:
    """SGLang's abort-mode pause (pause_mode abort, or the drain's fallback): every request it holds comes
    back aborted (HTTP 200, finish_reason abort, the tokens so far); counted from its load just before."""
    in_flight = requests_in_flight(record["api_url"], deadline)
    record["paused_at"] = time.time()
    step(record, "pause", "/pause_generation", {"mode": mode or record["mode"]}, deadline, save)
    record["clients"] = {"in_flight": in_flight, "completed": 0 if in_flight is not None else None,
                         "aborted": in_flight}
    save(record)


def drain_sglang(record: dict, deadline: float, bound: float, save) -> None:
    """Release nothing before SGLang is idle, and abort nothing to make it so: wait while it serves for its
    scheduler to be idle, close admission with an in-place pause, settle, and ask again; a request that slipped
    in before the pause is let finish (continue) and the wait goes on. Past `bound` s: DrainTimeout, the engine
    serving as before (nothing released)."""
    base, began = record["api_url"], time.monotonic()
    end = min(began + bound, deadline - DRAIN_WAIT_S)
    in_flight = requests_in_flight(base, deadline)
    record["drain"] = {"in_flight": in_flight, "pauses": 0, "bound_s": bound}
    save(record)
    while time.monotonic() < end:
        if not sglang_idle(base, min(DRAIN_WAIT_S, end - time.monotonic()), deadline):
            continue
        record["drain"]["pauses"] += 1
        record["paused_at"] = time.time()
        step(record, "pause", "/pause_generation", {"mode": "in_place"}, deadline, save)
        time.sleep(DRAIN_SETTLE_S)
        if sglang_idle(base, 0.0, deadline):
            record["drain"].update(outcome="drained", waited_s=round(time.monotonic() - began, 3))
            record["clients"] = {"in_flight": in_flight, "completed": in_flight, "aborted": 0,
                                 "drained_s": record["drain"]["waited_s"]}
            save(record)
            return
        unpause(record, deadline, save)  # it slipped in: it runs to its end like the others
    record["drain"].update(outcome="timeout", waited_s=round(time.monotonic() - began, 3),
                           in_flight_at_end=requests_in_flight(base, deadline))
    save(record)
    raise DrainTimeout(record, bound)


def unpause(record: dict, deadline: float, save) -> None:
    """Undo the drain's in-place pause: continue, then drop the step (nothing is paused any more)."""
    expect_ok("POST", record["api_url"] + "/continue_generation", deadline, {})
    record["steps"] = [s for s in record["steps"] if s["step"] != "pause"]
    save(record)


def sglang_idle(base: str, wait_s: float, deadline: float) -> bool:
    """Whether SGLang's scheduler is fully idle (nothing running or waiting: what release_memory_occupation
    asserts), as its /flush_cache answers: 200 once idle within wait_s (it flushes the prefix cache then, as
    the release would), 400 if not (the scheduler logs the counts). The cache flush is its only side effect."""
    began = time.monotonic()
    # its answer is plain text either way ("Cache flushed. …"): only the status tells, so no JSON is asked for
    status, raw = exchange("POST", "%s/flush_cache?timeout=%g" % (base, max(0.0, round(wait_s, 1))), deadline)
    if status == 200:
        return True
    if status != 400:
        raise EngineError("POST %s/flush_cache answered %d: %s" % (
            base, status, raw.decode("utf-8", "replace").strip()[-300:]))
    if time.monotonic() - began < wait_s / 2:  # a server that does not wait (no timeout parameter): poll
        time.sleep(POLL_S)
    return False


def requests_in_flight(base: str, deadline: float):
    """Running + waiting requests as SGLang's /get_load reports them (summed over its data-parallel ranks), or
    None when it does not say."""
    status, answer = call("GET", base + "/get_load", deadline)
    if status != 200 or not isinstance(answer, list):
        return None
    counts = [entry.get("num_reqs") for entry in answer if isinstance(entry, dict)]
    if not counts or not all(isinstance(n, int) and not isinstance(n, bool) for n in counts):
        return None
    return sum(counts)


class DrainTimeout(EngineError):
    """The drain's bound passed with requests still in SGLang: nothing was released, the engine serves."""

    def __init__(self, record: dict, bound: float) -> None:
        left = record["drain"].get("in_flight_at_end")
        super().__init__(
            "SGLang at %s still had %s after service.drain_timeout (%.0f s): nothing was released and it kept "
            "serving (the drain never aborts a request); raise service.drain_timeout, or set "
            "service.drain_fallback: abort to abort the requests still in flight past the bound "
            "(service.pause_mode: abort aborts them at once)" % (
                record["api_url"], "requests in flight" if left is None else "%d requests in flight" % left, bound))


def release_tag(record: dict, tag: str, deadline: float, save) -> None:
    step(record, tag, "/release_memory_occupation", {"tags": [tag]}, deadline, save)


def step(record: dict, name: str, route: str, body, deadline: float, save) -> None:
    """One POST, recorded before it is asked; an answer other than 2xx means it did not happen (dropped
    from the record), no answer leaves it pending."""
    entry = begin(record, name, save)
    status, answer = call("POST", record["api_url"] + route, deadline, body)
    if not 200 <= status < 300:
        record["steps"].remove(entry)
        save(record)
        raise EngineError("POST %s%s answered %d: %s" % (record["api_url"], route, status, answer))
    finish(record, entry, save)


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


def sleep_vllm(record: dict, deadline: float, save) -> None:
    base = record["api_url"]
    step(record, "sleep", "/sleep?level=1", None, deadline, save)
    wait_for(lambda: is_sleeping(base, deadline), deadline, "%s/is_sleeping to say true" % base)


def is_sleeping(base: str, deadline: float) -> bool:
    answer = expect_ok("GET", base + "/is_sleeping", deadline)
    if not isinstance(answer, dict) or "is_sleeping" not in answer:
        raise EngineError("%s/is_sleeping answered %r" % (base, answer))
    return bool(answer["is_sleeping"])


# ── resume ────────────────────────────────────────────────────────────────────────────────────────────

def resume(record: dict, deadline: float, health_url=None) -> dict:
    """Give back what the record says was released, then wait until the engine serves; returns the timings
    (resume_s, health_s). Raises EngineError when the API does not answer, a step fails, or the record has
    an SGLang release whose answer was never seen: the caller then restarts the unit."""
    began = time.monotonic()
    if record["engine"] == "sglang":
        resume_sglang(record, deadline)
        health = record["api_url"] + "/health_generate"
    else:
        wake_vllm(record, deadline)
        health = health_url or record["api_url"] + "/health"
    resumed = time.monotonic()
    wait_for(lambda: exchange("GET", health, deadline)[0] == 200, deadline, "%s to answer 200" % health)
    return {"resume_s": round(resumed - began, 3), "health_s": round(time.monotonic() - resumed, 3)}


def resume_sglang(record: dict, deadline: float) -> None:
    base, steps = record["api_url"], record.get("steps", [])
    unknown = [name for name in pending(record) if name != "pause"]
    if unknown:
        raise EngineError("the release of %s was asked but its answer never seen: whether it happened is "
                          "unknown" % ", ".join(unknown))
    for entry in reversed(steps):  # weights before the KV cache: the pool is laid out after the weights
        if entry["step"] in (KV_CACHE, WEIGHTS):
            expect_ok("POST", base + "/resume_memory_occupation", deadline, {"tags": [entry["step"]]})
    if steps:  # a pause asked, answered or not: continuing an engine that is not paused does nothing
        expect_ok("POST", base + "/continue_generation", deadline, {})


def wake_vllm(record: dict, deadline: float) -> None:
    base = record["api_url"]
    if not is_sleeping(base, deadline):  # a sleep asked but never answered may not have happened
        return
    expect_ok("POST", base + "/wake_up", deadline)
    wait_for(lambda: not is_sleeping(base, deadline), deadline, "%s/is_sleeping to say false" % base)


def describe(record: dict) -> str:
    """"kv_cache, weights released through SGLang's API" and the like, for messages."""
    done = [s["step"] for s in record.get("steps", []) if s.get("done") and s["step"] != "pause"]
    if record["engine"] == "vllm":
        return "vLLM put to sleep (level 1)" if done else "vLLM asked to sleep"
    return "%s released through SGLang's API" % (", ".join(done) or "nothing")


# ── the restore of a job that released ────────────────────────────────────────────────────────────────

def restore_released(job, deadline: float) -> tuple:
    """Every restorer's way back for a job whose status records a release: resume it through the API within
    half of what is left, else restart the unit (the service comes back whatever happens) and say so.
    job: a supervision/record.py Job. Returns (healthy, active_state); service.resumed says how."""
    service = job.status["service"]
    unit, record = service["unit"], service["released"]
    job.note_restore("resuming %s: %s" % (unit, describe(record)))
    began = time.monotonic()
    try:
        timings = resume(record, time.monotonic() + (deadline - time.monotonic()) / 2,
                         job.spec["service"].get("health_url"))
    except Exception as exc:  # an EngineError, or a record it could not act on: the restart brings it back anyway
        job.note_restore("the %s API did not bring %s back (%s): restarting the unit" % (
            record.get("engine"), unit, exc if isinstance(exc, EngineError) else "%s: %s" % (type(exc).__name__, exc)))
        return restart_unit(job, unit, deadline, began)
    job.save(service=dict(job.status["service"], resumed=dict(timings, how="api")))
    try:
        return True, job.ctl.is_active(unit)
    except Fail as exc:  # resumed, but systemctl could not say how the unit is
        return True, "unknown (%s)" % exc


def restart_unit(job, unit: str, deadline: float, began: float) -> tuple:
    """`systemctl restart` and the health wait; resume_s counts from `began` (the API's failed attempt too)."""
    try:
        job.ctl.change("restart", unit, timeout=max(0.5, deadline - time.monotonic()))
        restarted = time.monotonic()
        healthy, now = wait_healthy(job.ctl, unit, job.spec["service"].get("health_url"), deadline - restarted,
                                    job.note_restore)
    except Fail as exc:
        job.note_restore("restarting %s failed: %s" % (unit, exc))
        return False, "unknown"
    job.save(service=dict(job.status["service"], resumed={
        "how": "restart", "resume_s": round(restarted - began, 3), "health_s": round(time.monotonic() - restarted, 3)}))
    job.note_restore("%s restarted (its engine was released and the API did not resume it)" % unit)
    return healthy, now


# ── downtime: the same parts for every method ─────────────────────────────────────────────────────────

def downtime(service: dict, gpu, restore_began: float, restored_at: float, healthy: bool) -> dict:
    """"Not serving" from the stop/pause/sleep to healthy again (None while not healthy), and its parts:
    release (stop or API calls), drain (the wait for free memory), payload (the run, its end and the GPU
    release wait), resume (start, API resume or restart), health (the wait for healthy). Wall-clock
    seconds; None for a part this job did not see (an adopted stop)."""
    stopped, freed = service.get("stopped_at"), service.get("freed_at")
    resumed, drain_s = service.get("resumed") or {}, (gpu or {}).get("drained_after_s")

    def span(start, end):
        return round(end - start, 3) if start is not None and end is not None else None
    payload_end = restore_began - (drain_s or 0.0)
    released = service.get("released") or {}
    parts = {"method": released.get("engine", "stop"),
             "not_serving_s": span(stopped, restored_at) if healthy else None,
             "release_s": span(stopped, freed), "drain_s": drain_s, "payload_s": span(freed, payload_end),
             "resume_s": resumed.get("resume_s"), "health_s": resumed.get("health_s")}
    if released.get("clients") is not None:  # SGLang: its requests in flight at the pause, and their fate
        parts.update(pause_mode=released.get("mode"), clients=released["clients"])
    return parts
