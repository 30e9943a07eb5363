"""How a systemd unit stops, for a job that stops it: a hint before (a serving engine that takes seconds to stop
under the default KillMode), and what the stop left (a unit `failed` by its own shutdown, cleared before the
start). Under KillMode=control-group systemd SIGTERMs every process of the unit at once: an engine's children
die before its launcher asks them to, the launcher takes its crash path and exits non-zero, and the unit is
`failed` until the next start. KillMode=mixed lets the engine shut its own children down.
"""
from __future__ import annotations

import re

from .answer import Fail
from .processes import run_command

STOP_PROPERTIES = "KillMode,ExecStart,TimeoutStopUSec"
ENGINE_COMMAND = re.compile(r"sglang|vllm", re.IGNORECASE)


def parse_properties(text: str) -> dict:
    """`systemctl show --property=A,B UNIT`: KEY=VALUE lines (systemd's order, not the requested one)."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def exec_command(value: str) -> str:
    """ExecStart's command line: `{ path=… ; argv[]=CMD ; ignore_errors=… }` → CMD (each line's, joined)."""
    commands = re.findall(r"argv\[\]=(.*?) ; ", value)
    return " | ".join(commands) if commands else value.strip()


def slow_stop_hint(unit: str, settings: dict):
    """A warning line when stopping UNIT will take seconds and leave it failed: KillMode=control-group with an
    ExecStart that runs SGLang or vLLM; else None."""
    command = exec_command(settings.get("ExecStart", ""))
    found = ENGINE_COMMAND.search(command)
    if settings.get("KillMode", "").strip() != "control-group" or not found:
        return None
    engine = found.group(0)
    timeout = settings.get("TimeoutStopUSec", "").strip() or "its TimeoutStopSec"
    return ("%s runs %s with KillMode=control-group: the stop SIGTERMs its children before the engine asks them "
            "to, so it takes seconds (up to %s) and leaves the unit failed until the restore starts it; "
            "KillMode=mixed in the unit lets the engine stop its own children (docs/guide.md: what the remote host needs)"
            % (unit, engine, timeout))


def stop_settings(ctl, unit: str) -> dict:
    """The unit's KillMode, ExecStart and TimeoutStopUSec; {} when systemctl cannot say."""
    try:
        done = run_command(ctl.argv("systemctl", "show", "--property=" + STOP_PROPERTIES, unit), timeout=10)
    except Fail:
        return {}
    return parse_properties(done.stdout.decode("utf-8", "replace")) if done.returncode == 0 else {}


def failed_by_stop(ctl, unit: str):
    """The record that says UNIT's failed state is this job's stop's, not the service's."""
    try:
        done = run_command(ctl.argv("systemctl", "show", "--property=Result", unit), timeout=10)
        result = parse_properties(done.stdout.decode("utf-8", "replace")).get("Result", "").strip()
    except Fail:
        result = ""
    return {"state": "failed", "result": result or "unknown", "by": "this job's stop"}


def reset_failed(ctl, unit: str) -> str:
    """Clear UNIT's failed mark before its start; "" or why not (the start goes on either way)."""
    try:
        ctl.change("reset-failed", unit, timeout=10)
        return ""
    except Fail as exc:
        return "reset-failed %s: %s" % (unit, exc)
