"""A unit's health: active, and its health URL answered 2xx by the unit itself (stdlib only).

Its health URL is one more of the engine's routes: asked through the engine's bounded client (host/http_client.py), so
every restorer's wait for the unit is bounded and none ends in a crash on what the engine answers.
"""
from __future__ import annotations

import time

from .answer import Fail
from .http_client import EngineError, exchange
from .listener import foreign_holder, unit_cgroup
from .systemd import Systemd

STAY_ACTIVE_S = 2.0       # without a health URL, how long a unit must stay active to count as healthy


def health_ok(url: str, timeout: float) -> bool:
    """True when url answers 2xx. The health route is the engine's, as hostile as its other routes: asked
    through the engine's client (the whole call bounded, the body capped, no redirect, no proxy), and any
    answer it cannot read (malformed, trickled, cut short) is not healthy, never a crash or a hang."""
    try:
        status, _ = exchange("GET", url, time.monotonic() + min(5.0, max(0.2, timeout)))
    except EngineError:
        return False
    return 200 <= status < 300


def wait_healthy(ctl: Systemd, unit: str, url, timeout: float, note=None):
    """Poll until healthy, failed or timeout; returns (healthy, active_state). Healthy: active and the
    health URL answers 2xx from the unit itself (an answer from a process outside the unit that holds its port
    is not the unit's: host/listener.py; `note` hears who, once); with no URL, active for STAY_ACTIVE_S in a row
    (a Type=simple unit is "active" the moment its process is forked, even one that dies a second later)."""
    deadline = time.monotonic() + timeout
    active_since, squatter = None, None
    while True:
        state = ctl.is_active(unit)
        now = time.monotonic()
        active_since = (active_since or now) if state == "active" else None
        if active_since is not None and (health_ok(url, deadline - now) if url else now - active_since >= STAY_ACTIVE_S):
            held = held_outside(ctl, unit, url) if url else None
            if held is None:
                return True, state
            if held != squatter and note is not None:
                note("%s answered, but not from %s: %s" % (url, unit, held))
            squatter = held
        if state == "failed" or now >= deadline:
            return False, state
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


def held_outside(ctl: Systemd, unit: str, url: str):
    """Who holds url's port outside the unit (host/listener.py), or None. The unit's cgroup comes from its
    MainPID's /proc/PID/cgroup (world-readable), not from another systemctl property: under `sudo: true` the
    README's sudoers rule allows only the calls runner makes, and it already reads MainPID."""
    try:
        main_pid = ctl.show(unit)["main_pid"]
    except Fail:
        return None
    group = unit_cgroup(main_pid, unit) if main_pid else None
    return foreign_holder(group, url) if group else None
