"""vLLM: put to sleep once the requests in flight have finished, and woken, by its release row (engine_releases.py).

Every route is a dev route (VLLM_SERVER_DEV_MODE=1) and sleep needs --enable-sleep-mode; vLLM's --api-key does
not guard them.
"""
from __future__ import annotations

import time

from .engine_api import Api, step
from .http_client import EngineError, wait_for

DEFAULT_WAKE = ("/wake_up",)  # a record written without its release row


def sleep(api: Api, record: dict, deadline: float, save) -> None:
    in_flight = requests_in_flight(api, deadline)
    record["paused_at"] = time.time()
    for route in record["release"]["quiesce"]:
        step(api, record, "sleep" if route.startswith("/sleep") else "pause", route, None, deadline, save)
    wait_for(lambda: is_sleeping(api, deadline), deadline, "%s/is_sleeping to say true" % api.base)
    # they finished before the memory went; arrivals since were queued and are served after the wake
    record["clients"] = {"at_pause": in_flight, "completed": in_flight, "held": 0, "aborted": 0, "truncated": 0,
                         "refused": 0}
    save(record)


def wake(api: Api, record: dict, deadline: float) -> None:
    """Undo what the record says was asked: /wake_up while it sleeps (a sleep asked but never answered may not
    have happened), then whatever else the row wakes with (/resume: a no-op on an engine not paused)."""
    for route in (record.get("release") or {}).get("wake", DEFAULT_WAKE):
        if route == "/wake_up" and not is_sleeping(api, deadline):
            continue
        if route != "/wake_up" and not record.get("steps"):
            continue
        api.expect_ok("POST", route, deadline)
    wait_for(lambda: not is_sleeping(api, deadline), deadline, "%s/is_sleeping to say false" % api.base)


def is_sleeping(api: Api, deadline: float) -> bool:
    answer = api.expect_ok("GET", "/is_sleeping", deadline)
    if not isinstance(answer, dict) or "is_sleeping" not in answer:
        raise EngineError("%s/is_sleeping answered %r" % (api.base, answer))
    return bool(answer["is_sleeping"])


def requests_in_flight(api: Api, deadline: float):
    """Running + waiting requests by vLLM's Prometheus gauges, or None when /metrics does not say."""
    try:
        status, raw = api.exchange("GET", "/metrics", deadline, admin=False)
    except EngineError:
        return None
    if status != 200:
        return None
    total, seen = 0.0, False
    for line in raw.decode("utf-8", "replace").splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                return None
            seen = True
    return int(total) if seen else None
