"""systemd: the systemctl/systemd-run/journalctl argv for one scope, a unit's state and log tail, a bounded start."""
from __future__ import annotations

import socket

from .answer import Fail
from .parsers import parse_systemctl_show
from .processes import CMD_TIMEOUT_S, run_command

# What systemctl says when no manager of its scope can be reached (PID 1 is not systemd, no user manager).
NO_MANAGER_SIGNS = ("has not been booted with systemd", "Failed to connect to bus")


def no_service_manager(stderr: str) -> bool:
    return any(sign in stderr for sign in NO_MANAGER_SIGNS)


class Systemd:
    """systemctl/systemd-run/journalctl argv for one scope. With sudo, every call goes through `sudo -n`:
    a login that may not manage the unit often cannot even read its state (no system bus access)."""

    def __init__(self, scope: str = "system", sudo: bool = False) -> None:
        self.user = ["--user"] if scope == "user" else []
        self.sudo = ["sudo", "-n"] if sudo else []

    def argv(self, tool: str, *args: str) -> list:
        return self.sudo + [tool] + self.user + list(args)

    def show(self, unit: str) -> dict:
        done = run_command(self.argv("systemctl", "show", "--property=ActiveState,SubState,MainPID", unit))
        if done.returncode != 0:
            said = done.stderr.decode("utf-8", "replace").strip()[-300:]
            if no_service_manager(said):
                raise Fail("no-systemd", "cannot manage %s: this host's services are not run by systemd (%s)"
                           % (unit, said.splitlines()[0]))
            raise Fail("internal", "cannot read the state of %s: %s" % (unit, said))
        return parse_systemctl_show(done.stdout.decode("utf-8", "replace"))

    def refuse_missing(self, unit: str, active_state: str) -> None:
        """An inactive unit systemd has no file for (a misspelt service.unit, or the other service.scope): refused
        before anything waits for it to start; a sudo rule without this call leaves it unasked."""
        if active_state != "inactive":
            return
        try:
            done = run_command(self.argv("systemctl", "show", "--property=LoadState", unit))
        except Fail:
            return
        if done.stdout.strip() == b"LoadState=not-found":
            raise Fail("preflight-refused", "no unit %s on %s (%s units)" % (
                unit, socket.gethostname(), "the login's user" if self.user else "system"),
                hint="Check service.unit and service.scope: `systemctl list-unit-files` on the host lists them.")

    def is_active(self, unit: str) -> str:
        done = run_command(self.argv("systemctl", "is-active", unit))
        return done.stdout.decode("utf-8", "replace").strip() or "unknown"

    def change(self, verb: str, unit: str, *flags: str, timeout: float = CMD_TIMEOUT_S) -> None:
        done = run_command(self.argv("systemctl", verb, *flags, unit), timeout=timeout)
        if done.returncode != 0:
            raise Fail("internal", "systemctl %s %s failed (exit %d): %s" % (
                verb, unit, done.returncode, done.stderr.decode("utf-8", "replace").strip()[-500:]))

    def timer_argv(self, unit: str, seconds: float, command: list, run_max: float) -> list:
        # AccuracySec: systemd otherwise may fire a timer up to a minute late. RuntimeMaxSec: the command it
        # runs is killed after run_max (a transient service runs without a bound otherwise).
        return self.argv("systemd-run", "--on-active=%ds" % int(seconds), "--timer-property=AccuracySec=1s",
                         "--property=RuntimeMaxSec=%d" % int(run_max), "--unit=" + unit, *command)

    def log_tail(self, unit: str, lines: int = 20) -> str:
        """The unit's last log lines; without a journal, say so and show `systemctl status` instead."""
        try:
            done = run_command(self.argv("journalctl", "-u", unit, "-n", str(lines), "--no-pager"), timeout=20)
            text = done.stdout.decode("utf-8", "replace").strip()
            if done.returncode == 0 and text and "No entries" not in text:
                return text
            why = "journalctl has no entries for %s" % unit
        except Fail as exc:
            why = str(exc)
        done = run_command(self.argv("systemctl", "status", "--no-pager", "-n", str(lines), unit), timeout=20)
        return "%s; systemctl status says:\n%s" % (why, done.stdout.decode("utf-8", "replace").strip())


def start_unit(ctl: Systemd, unit: str, timeout: float) -> str:
    """`systemctl start`, bounded; returns "" or why it did not finish (the unit's state then tells the rest).
    A start cut short by the timeout goes on inside systemd; only the wait for it ends."""
    try:
        ctl.change("start", unit, timeout=max(0.5, timeout))
        return ""
    except Fail as exc:
        if exc.code == "sudo-password":
            raise
        return str(exc)
