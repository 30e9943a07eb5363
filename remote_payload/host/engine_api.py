"""A serving engine's HTTP API as runner calls it: its root, the key it wants, and the record of what was asked.

The key: the spec names where it lives on the host (`file:PATH` or `env:NAME` of the unit's environment), never
the key itself. It is read when a call needs it, kept in memory only, and sent as `Authorization: Bearer`; no
record, log, status or message holds it. SGLang's admin routes want --admin-api-key when the server has one, else
--api-key. A 401 or 403 is `KeyRefused`, naming the spec field to set. vLLM's dev routes take no key.

The record: each step is handed to `save` before it is asked for and again once it answered: a step whose answer
was never seen is pending.
"""
from __future__ import annotations

import shlex
import time

from .answer import Fail
from .http_client import EngineError, NotSent, call, exchange
from .processes import run_command

RETRY_FIRST_S, RETRY_MAX_S = 0.2, 2.0  # a request that never reached the engine, asked again this far apart


class KeyRefused(EngineError):
    """The engine answered 401 or 403: it wants a key runner was not given, or refused the one it sent."""


class Api:
    """One engine's API: `base` its root URL; service: the spec's service section (its key fields, unit, scope)."""

    def __init__(self, base: str, service: dict) -> None:
        self.base, self.service = base.rstrip("/"), service
        self.keys = {}  # type: dict

    def field(self, admin: bool):
        """The spec field whose key a route wants (None: no key named)."""
        if admin and self.service.get("admin_api_key"):
            return "admin_api_key"
        return "api_key" if self.service.get("api_key") else None

    def headers(self, admin: bool) -> dict:
        name = self.field(admin)
        if name is None:
            return {}
        if name not in self.keys:
            self.keys[name] = read_key(self.service, name)
        return {"Authorization": "Bearer " + self.keys[name]}

    def call(self, method: str, route: str, deadline: float, body=None, admin: bool = True):
        status, answer = until_sent(lambda: call(method, self.base + route, deadline, body, self.headers(admin)),
                                    deadline)
        self.check_key(method, route, status, admin)
        return status, answer

    def exchange(self, method: str, route: str, deadline: float, admin: bool = True):
        status, raw = until_sent(lambda: exchange(method, self.base + route, deadline, None, self.headers(admin)),
                                 deadline)
        self.check_key(method, route, status, admin)
        return status, raw

    def expect_ok(self, method: str, route: str, deadline: float, body=None, admin: bool = True):
        status, answer = self.call(method, route, deadline, body, admin)
        if not 200 <= status < 300:
            raise EngineError("%s %s%s answered %d: %s" % (method, self.base, route, status, answer))
        return answer

    def check_key(self, method: str, route: str, status: int, admin: bool) -> None:
        if status not in (401, 403):
            return
        name = self.field(admin)
        if name is None:
            raise KeyRefused("%s %s%s answered %d: the engine wants an API key; name where it lives on the host "
                             "with service.%s (file:PATH or env:NAME of the unit's environment), never the key "
                             "itself" % (method, self.base, route, status, "admin_api_key" if admin else "api_key"))
        raise KeyRefused("%s %s%s answered %d: the engine refused the key of service.%s (%s)" % (
            method, self.base, route, status, name, self.service[name]))


def until_sent(ask, deadline: float):
    """ask()'s answer, asked again while the request never reached the engine (NotSent) and the deadline allows:
    an engine holding many clients' connections may refuse a new one for a while."""
    wait = RETRY_FIRST_S
    while True:
        try:
            return ask()
        except NotSent:
            if time.monotonic() + wait >= deadline:
                raise
        time.sleep(wait)
        wait = min(2 * wait, RETRY_MAX_S)


# ── the key, read where it lives ───────────────────────────────────────────────────────────────────────

def read_key(service: dict, name: str) -> str:
    """The key service[name] names (file:PATH or env:NAME); EngineError naming the field (never the key)."""
    kind, _, where = service[name].partition(":")
    try:
        key = read_key_file(where) if kind == "file" else unit_environment(service).get(where)
    except (OSError, ValueError, Fail) as exc:  # ValueError: a quote shlex cannot close, a bad encoding
        raise EngineError("service.%s (%s): %s: %s" % (name, service[name], type(exc).__name__, exc)) from exc
    if not key:
        raise EngineError("service.%s (%s): %s" % (name, service[name], "the file is empty" if kind == "file" else
                                                  "the unit's Environment= and EnvironmentFile= do not set it"))
    return key


def read_key_file(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read(4096).strip()


def unit_environment(service: dict) -> dict:
    """The unit's Environment= assignments, then its EnvironmentFile= files, as systemd sets them."""
    from .systemd import Systemd
    ctl = Systemd(service.get("scope", "system"), service.get("sudo", False))
    done = run_command(ctl.argv("systemctl", "show", "--property=Environment,EnvironmentFiles", service["unit"]))
    if done.returncode != 0:
        raise Fail("internal", "systemctl show %s: %s" % (service["unit"], done.stderr.decode("utf-8", "replace")[-300:]))
    return parse_unit_environment(done.stdout.decode("utf-8", "replace"), read_environment_file)


def parse_unit_environment(shown: str, read_file) -> dict:
    """`systemctl show --property=Environment,EnvironmentFiles` → {NAME: value}; files read by read_file(path)
    (a file marked ignore_errors=yes that cannot be read is skipped, as systemd skips it)."""
    found = {}  # type: dict
    for line in shown.splitlines():
        key, _, value = line.partition("=")
        if key == "Environment":
            found.update(pair.partition("=")[::2] for pair in shlex.split(value) if "=" in pair)
        elif key == "EnvironmentFiles" and value.strip():
            path, _, flags = value.strip().partition(" ")
            try:
                found.update(read_file(path))
            except OSError:
                if "ignore_errors=yes" not in flags:
                    raise
    return found


def read_environment_file(path: str) -> dict:
    found = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle.read(1 << 20).splitlines():
            line = line.strip()
            if line and not line.startswith(("#", ";")) and "=" in line:
                name, value = line.split("=", 1)
                found[name.strip()] = shlex.split(value)[0] if value.strip() else ""
    return found


# ── the record of what was asked ──────────────────────────────────────────────────────────────────────

def pending(record: dict) -> list:
    return [s["step"] for s in record.get("steps", []) if not s.get("done")]


def step(api: Api, record: dict, name: str, route: str, body, deadline: float, save) -> None:
    """One POST, recorded before it is asked; an answer other than 2xx means it did not happen (dropped
    from the record), no answer leaves it pending."""
    entry = {"step": name, "done": False}
    record["steps"].append(entry)
    save(record)
    try:
        status, answer = api.call("POST", route, deadline, body)
    except KeyRefused:
        record["steps"].remove(entry)
        save(record)
        raise
    if not 200 <= status < 300:
        record["steps"].remove(entry)
        save(record)
        raise EngineError("POST %s%s answered %d: %s" % (api.base, route, status, answer))
    entry["done"] = True
    save(record)

