"""SGLang: how its GPU memory is released and resumed, by the pause mode its release row allows (engine_releases.py
describes each mode's sequence): pause (retract, drain or abort) → release kv_cache → weights only if still short
and only with their CPU backup (without it they come back as uninitialised memory).

SGLang's release asserts its scheduler is idle and takes the whole server down if not. /v1/loads cannot confirm
a retraction (its snapshot stands still while paused); /flush_cache does, answering by the release's own rule.
"""
from __future__ import annotations

import time

from .engine_api import Api, step
from .http_client import POLL_S, EngineError

DRAIN_TIMEOUT_S = 60.0    # service.drain_timeout: how long the drain may wait for SGLang to be idle
DRAIN_WAIT_S = 10.0       # one /flush_cache?timeout= wait: SGLang answers as soon as its scheduler is idle
DRAIN_SETTLE_S = 0.2      # after the in-place pause: a request that passed SGLang's gate just before it reaches
                          # the scheduler (its tokenization) before the idle check asks
CONFIRM_S = 5.0           # after the retract pause: how long the running batch may take to be empty
KV_CACHE, WEIGHTS = "kv_cache", "weights"
REFUSED = {"in_place": "SGLang's in_place keeps the running requests and their KV cache in the scheduler, and "
                       "release_memory_occupation asserts that nothing runs: with requests in flight the server "
                       "aborts itself (and the requests are lost)",
           "retract": "this release's release_memory_occupation asserts that the waiting queue is empty too, and "
                      "retract puts the running requests there: with requests in flight the server aborts itself "
                      "(and the requests are lost); retract needs SGLang 0.5.21 or later"}


class NothingReleased(EngineError):
    """The engine was not quiet within its bound: nothing was released, nothing left paused, the engine serves."""


class DrainTimeout(NothingReleased):
    """The drain's bound passed with requests still in SGLang."""

    def __init__(self, record: dict, bound: float) -> None:
        left = record["drain"].get("in_flight_at_end")
        super().__init__(
            "SGLang at %s still had %s after service.drain_timeout (%.0f s): nothing was released and it kept "
            "serving (the drain never aborts a request); raise service.drain_timeout, or set "
            "service.drain_fallback: abort to abort the requests still in flight past the bound "
            "(service.pause_mode: abort aborts them at once)" % (
                record["api_url"], "requests in flight" if left is None else "%d requests in flight" % left, bound))


def mode_problem(row: dict, mode: str):
    """Why this release cannot release after `mode` (None: it can)."""
    if mode in row["modes"]:
        return None
    return "service.pause_mode %s: %s (SGLang %s can release after: %s)" % (
        mode, REFUSED.get(mode, "not a pause mode"), row["version"], ", ".join(row["modes"]))


def release(api: Api, record: dict, offers: dict, need_mib: int, gpu_free_fn, deadline: float, save,
            service: dict, enough) -> None:
    row, mode = record["release"], record["mode"]
    problem = mode_problem(row, mode)
    if problem:  # the preflight refuses it; a spec that got here anyway touches nothing
        raise EngineError(problem)
    if mode == "retract":
        retract(api, record, deadline, save)
    elif mode == "drain":
        drain_or_fall_back(api, record, deadline, save, service)
    else:
        abort_all(api, record, deadline, save)
    release_tag(api, record, KV_CACHE, deadline, save)
    if enough(need_mib, gpu_free_fn, deadline):
        return
    if not offers["weights_cpu_backup"]:
        record["short_after"] = KV_CACHE
        save(record)
        return  # the drain names the shortfall; weights without their CPU backup would come back garbage
    release_tag(api, record, WEIGHTS, deadline, save)


def retract(api: Api, record: dict, deadline: float, save) -> None:
    """Hold every request instead of aborting any: SGLang 0.5.21+ releases with a waiting queue once paused."""
    in_flight = requests_in_flight(api, record, deadline)
    record["paused_at"] = time.time()
    step(api, record, "pause", "/pause_generation", {"mode": "retract"}, deadline, save)
    end = min(deadline, time.monotonic() + CONFIRM_S)
    while not idle(api, 0.0, deadline):
        if time.monotonic() + POLL_S >= end:
            unpause(api, record, deadline, save)
            raise NothingReleased("SGLang at %s still had a running batch %.0f s after its retract pause: nothing "
                                  "was released and it serves again (a release now would kill it)" % (
                                      api.base, CONFIRM_S))
        time.sleep(POLL_S)
    record["clients"] = window(in_flight, held=in_flight)
    save(record)


def window(in_flight, held=0, aborted=0) -> dict:
    """What the clients in flight at the pause saw: held (answered whole after the resume), aborted (truncated)."""
    return {"at_pause": in_flight, "held": held, "aborted": aborted, "truncated": aborted, "refused": 0}


def drain_or_fall_back(api: Api, record: dict, deadline: float, save, service: dict) -> None:
    bound = service.get("drain_timeout") or DRAIN_TIMEOUT_S
    try:
        drain(api, record, deadline, bound, save)
    except DrainTimeout:
        if (service.get("drain_fallback") or "skip") != "abort":
            raise
        abort_all(api, record, deadline, save, "abort")  # the operator's choice (drain_fallback: abort)
        record["clients"]["drain_timed_out_s"] = record["drain"]["waited_s"]
        record["drain"]["fallback"] = "abort"
        save(record)


def abort_all(api: Api, record: dict, deadline: float, save, mode: str = "") -> None:
    """SGLang's abort-mode pause: every request it holds comes back truncated; counted from its load just before."""
    in_flight = requests_in_flight(api, record, deadline)
    record["paused_at"] = time.time()
    step(api, record, "pause", "/pause_generation", {"mode": mode or record["mode"]}, deadline, save)
    record["clients"] = window(in_flight, aborted=in_flight)
    save(record)


def drain(api: Api, record: dict, deadline: float, bound: float, save) -> None:
    """Release nothing before SGLang is idle, and abort nothing to make it so: wait while it serves for its
    scheduler to be idle, close admission with an in-place pause, settle, and ask again; a request that slipped
    in before the pause is let finish (continue) and the wait goes on. Each gate pause holds the clients that
    arrive meanwhile: counted (pauses, gate_held_s). Past `bound` s: DrainTimeout, nothing released."""
    began = time.monotonic()
    end = min(began + bound, deadline - DRAIN_WAIT_S)
    in_flight = requests_in_flight(api, record, deadline)
    record["drain"] = {"in_flight": in_flight, "pauses": 0, "gate_held_s": 0.0, "bound_s": bound}
    save(record)
    while time.monotonic() < end:
        if not idle(api, min(DRAIN_WAIT_S, end - time.monotonic()), deadline):
            continue
        record["drain"]["pauses"] += 1
        record["paused_at"], gate = time.time(), time.monotonic()
        step(api, record, "pause", "/pause_generation", {"mode": "in_place"}, deadline, save)
        time.sleep(DRAIN_SETTLE_S)
        if idle(api, 0.0, deadline):
            record["drain"].update(outcome="drained", waited_s=round(time.monotonic() - began, 3))
            record["clients"] = dict(window(0), drained_s=record["drain"]["waited_s"],
                                     gate_pauses=record["drain"]["pauses"])
            save(record)
            return
        unpause(api, record, deadline, save)  # it slipped in: it runs to its end like the others
        record["drain"]["gate_held_s"] = round(record["drain"]["gate_held_s"] + time.monotonic() - gate, 3)
    record["drain"].update(outcome="timeout", waited_s=round(time.monotonic() - began, 3),
                           in_flight_at_end=requests_in_flight(api, record, deadline))
    save(record)
    raise DrainTimeout(record, bound)


def unpause(api: Api, record: dict, deadline: float, save) -> None:
    """Undo a pause that released nothing: continue, then drop the step (nothing is paused any more)."""
    api.expect_ok("POST", "/continue_generation", deadline, {})
    record["steps"] = [s for s in record["steps"] if s["step"] != "pause"]
    record.pop("paused_at", None)
    save(record)


def idle(api: Api, wait_s: float, deadline: float) -> bool:
    """Whether SGLang's scheduler is idle by its release's own rule, as its /flush_cache answers: 200 once idle
    within wait_s (it flushes the prefix cache then, as the release would), 400 if not. Its answer is plain text
    either way: only the status tells."""
    began = time.monotonic()
    route = "/flush_cache?timeout=%g" % max(0.0, round(wait_s, 1))
    status, raw = api.exchange("POST", route, deadline)
    if status == 200:
        return True
    if status != 400:
        raise EngineError("POST %s%s answered %d: %s" % (api.base, route, status,
                                                        raw.decode("utf-8", "replace").strip()[-300:]))
    if time.monotonic() - began < wait_s / 2:  # a server that does not wait (no timeout parameter): poll
        time.sleep(POLL_S)
    return False


def requests_in_flight(api: Api, record: dict, deadline: float):
    """Running + waiting requests over every DP rank, by the release's load route, or None when it does not say."""
    route = record["release"]["load"]
    status, answer = api.call("GET", route, deadline, admin=False)
    if status != 200:
        return None
    if route == "/v1/loads":  # {"loads": [{"num_running_reqs", "num_waiting_reqs", ...} per rank]}
        ranks = answer.get("loads") if isinstance(answer, dict) else None
        keys = ["num_running_reqs", "num_waiting_reqs"]
    else:  # /get_load: [{"num_reqs": running + waiting, ...} per rank]
        ranks, keys = answer, ["num_reqs"]
    ranks = ranks if isinstance(ranks, list) else []
    counts = [rank.get(key) for rank in ranks if isinstance(rank, dict) for key in keys]
    if not counts or not all(isinstance(n, int) and not isinstance(n, bool) for n in counts):
        return None
    return sum(counts)


def release_tag(api: Api, record: dict, tag: str, deadline: float, save) -> None:
    step(api, record, tag, "/release_memory_occupation", {"tags": [tag]}, deadline, save)


def resume(api: Api, record: dict, deadline: float) -> None:
    """Resume what the record says was released (weights before the KV cache: the pool is laid out after the
    weights), then continue; an asked release whose answer was never seen is not guessed at (EngineError)."""
    steps = record.get("steps", [])
    unknown = [s["step"] for s in steps if not s.get("done") and s["step"] != "pause"]
    if unknown:
        raise EngineError("the release of %s was asked but its answer never seen: whether it happened is "
                          "unknown" % ", ".join(unknown))
    for entry in reversed(steps):
        if entry["step"] in (KV_CACHE, WEIGHTS):
            api.expect_ok("POST", "/resume_memory_occupation", deadline, {"tags": [entry["step"]]})
    if steps:  # a pause asked, answered or not: continuing an engine that is not paused does nothing
        api.expect_ok("POST", "/continue_generation", deadline, {})
