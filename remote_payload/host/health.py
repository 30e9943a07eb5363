"""A unit's health: active, and its health URL answered 2xx through the unit's own socket (host/listener.py)."""
from __future__ import annotations

import time

from .answer import Fail
from .http_client import EngineError, exchange
from .listener import judge, listeners, local_port
from .systemd import Systemd

STAY_ACTIVE_S = 2.0       # without a health URL, how long a unit must stay active to count as healthy


def health_ok(url: str, timeout: float) -> bool:
    """True when url answers 2xx. Asked through the engine's bounded client: an answer it cannot read
    (malformed, trickled, cut short) is not healthy, never a crash or a hang."""
    try:
        status, _ = exchange("GET", url, time.monotonic() + min(5.0, max(0.2, timeout)))
    except EngineError:
        return False
    return 200 <= status < 300


def units_answer(ctl: Systemd, unit: str, url: str, timeout: float):
    """None when url answered 2xx through the unit's own socket (host/listener.py; a URL of another host:
    the answer alone); else (why, for a human, or None)."""
    port = local_port(url)
    before = listeners(port) if port else {}
    if not health_ok(url, timeout):
        return (None,)
    if port is None:
        return None
    after = listeners(port)
    try:
        main_pid = ctl.show(unit)["main_pid"]  # a property runner reads anyway (the documented sudo rule allows it)
    except Fail:
        return (None,)
    return judge(port, before, after, main_pid, unit)


def wait_healthy(ctl: Systemd, unit: str, url, timeout: float, note=None):
    """Poll until healthy, failed or timeout; returns (healthy, active_state). Healthy: active and the health
    URL answered by the unit itself (`note` hears why not, each new reason once); with no URL, active for
    STAY_ACTIVE_S in a row (a Type=simple unit is "active" the moment it is forked, even one that dies at once)."""
    deadline = time.monotonic() + timeout
    active_since, said = None, None
    while True:
        state = ctl.is_active(unit)
        now = time.monotonic()
        active_since = (active_since or now) if state == "active" else None
        if active_since is not None and url:
            why = units_answer(ctl, unit, url, deadline - now)
            if why is None:
                return True, state
            if why[0] and why[0] != said and note is not None:
                note(why[0])
            said = why[0] or said
        elif active_since is not None and now - active_since >= STAY_ACTIVE_S:
            return True, state
        if state == "failed" or now >= deadline:
            return False, state
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
