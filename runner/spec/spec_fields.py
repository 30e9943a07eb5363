"""The job spec's field rules: each check takes what a user wrote and returns it normalised, or raises
ValueError with a message that says what is allowed (pydantic turns it into `field.path: message`).

The rules the host checks again (job ids, unit names, scripts, env keys, devices, host.root) come from
remote_payload/contract.py, so the controller can never accept what the host refuses. The rest (addresses,
users, interpreters, URLs, durations, argument values) only the controller needs.
"""
from __future__ import annotations

import ipaddress
import math
import re
import reprlib
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BeforeValidator, WithJsonSchema

from remote_payload import contract

MAX_DURATION_S = 7 * 24 * 3600.0
MAX_MIN_FREE_MIB = 16 << 20  # 16 TiB: more than any GPU has; a larger number is a typo, refused before a host is asked

_DURATION_RE = re.compile(r"(?:(?P<d>\d+(?:\.\d+)?)d)?(?:(?P<h>\d+(?:\.\d+)?)h)?"
                          r"(?:(?P<m>\d+(?:\.\d+)?)m)?(?:(?P<s>\d+(?:\.\d+)?)s)?")
_UNIT_SECONDS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_HOSTNAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}")
_USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
_BARE_PYTHON_RE = re.compile(r"[A-Za-z0-9._+-]+")
_ARG_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")


def _contract_rule(problem_of: Callable[[Any], str | None], value: Any) -> Any:
    """Apply one of contract's `*_problem` rules: the same verdict as the host's."""
    problem = problem_of(value)
    if problem is not None:
        raise ValueError(problem)
    return value


# -- describing what a user gave, briefly (a value may be a megabyte long) ---------------------------------

def _bounded_repr() -> reprlib.Repr:
    bounded = reprlib.Repr()
    bounded.maxlevel, bounded.maxlist, bounded.maxtuple, bounded.maxdict = 3, 8, 8, 8
    bounded.maxset = bounded.maxfrozenset = 8
    bounded.maxstring = bounded.maxlong = bounded.maxother = 80
    return bounded


_BOUNDED_REPR = _bounded_repr()


def short(value: Any) -> str:
    """repr() cut to 80 characters, computed from a bounded part of the value: a value shared many times
    over (YAML aliases) or a megabyte string costs no more than a small one."""
    text = _BOUNDED_REPR.repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


# -- durations --------------------------------------------------------------------------------------------

def parse_duration(value: Any) -> float:
    """Seconds from `90`, `2.5`, "90", "30s", "5m", "1h30m", "1d"; must be > 0 and at most 7 days.

    Raises ValueError (pydantic turns it into a field error; callers outside a model catch it).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"a duration must be a number of seconds or text like 30s, 5m, 1h30m; got {kind(value)}")
    # ints are compared as ints: float(10**400) would overflow before the range check could refuse it
    seconds = _seconds_from_text(value) if isinstance(value, str) else value
    if isinstance(seconds, float) and math.isnan(seconds):
        raise ValueError("a duration must be a number, not NaN")
    if seconds <= 0:
        raise ValueError(f"a duration must be more than 0 seconds; got {short(value)}")
    if seconds > MAX_DURATION_S:
        raise ValueError(f"a duration must be at most 7 days; got {short(value)}")
    return float(seconds)


def _seconds_from_text(text: str) -> float:
    stripped = text.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", stripped):
        return float(stripped)
    match = _DURATION_RE.fullmatch(stripped)
    if not stripped or match is None:
        raise ValueError(f"not a duration: {short(text)} (use seconds, or e.g. 30s, 5m, 1h30m, 1d)")
    return sum(float(amount) * _UNIT_SECONDS[unit] for unit, amount in match.groupdict().items() if amount)


# In the JSON Schema a duration is what a user may write: seconds, or text like 30s, 5m, 1h30m, 2d.
Duration = Annotated[float, BeforeValidator(parse_duration), WithJsonSchema(
    {"anyOf": [{"type": "number", "exclusiveMinimum": 0},
               {"type": "string", "pattern": r"^\s*(\d+(\.\d+)?|(\d+(\.\d+)?d)?(\d+(\.\d+)?h)?(\d+(\.\d+)?m)?(\d+(\.\d+)?s)?)\s*$"}]})]


# -- field checks (each raises ValueError with a message that says what is allowed) -----------------------

def _check_text(value: Any, what: str) -> str:
    """A string for argv or a file: anything but NUL (which cannot be passed to exec)."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string; got {kind(value)}")
    if "\0" in value:
        raise ValueError(f"{what} must not contain a NUL character")
    return value


def _check_printable_line(value: Any, what: str) -> str:
    text = _check_text(value, what)
    if not text.isprintable():
        raise ValueError(f"{what} must be printable text on one line (no newlines or control characters)")
    return text


def _check_name(value: Any) -> str:
    text = _check_printable_line(value, "name")
    if not 1 <= len(text) <= 100:
        raise ValueError(f"name must be 1 to 100 characters; got {len(text)}")
    return text


def _check_address(value: Any) -> str:
    text = _check_printable_line(value, "address")
    if text == "local" or _HOSTNAME_RE.fullmatch(text):
        return text
    try:
        address = ipaddress.ip_address(text.removeprefix("[").removesuffix("]"))
        if getattr(address, "scope_id", None):  # `fe80::1%anything` parses; a scope is no place for text
            raise ValueError("scoped IPv6 address")
        return str(address)
    except ValueError:
        raise ValueError(f"address must be `local`, a host name, an ssh_config alias or an IP address; "
                         f"got {short(text)}") from None


def _check_user(value: Any) -> str | None:
    if value is None:
        return None
    text = _check_printable_line(value, "user")
    if not _USER_RE.fullmatch(text):
        raise ValueError(f"user must be a login name ([A-Za-z0-9_][A-Za-z0-9._-]*, at most 64); got {short(text)}")
    return text


def _check_payload_user(value: Any) -> str | None:
    if value is None:
        return None
    return _contract_rule(contract.payload_user_problem, value)


def _check_host_root(value: Any) -> str:
    return _contract_rule(contract.root_problem, _check_printable_line(value, "root"))


def _check_python(value: Any) -> str:
    """An interpreter is argv[0]: a bare name looked up on PATH, or an absolute path; nothing relative."""
    text = _check_printable_line(value, "python")
    if text.startswith("/"):
        if ".." in PurePosixPath(text).parts:
            raise ValueError(f"python must not contain `..`; got {short(text)}")
        return text
    if _BARE_PYTHON_RE.fullmatch(text) and text not in (".", "..") and not text.startswith("-"):
        return text
    raise ValueError(f"python must be a bare name like python3 ([A-Za-z0-9._+-]) or an absolute path; "
                     f"got {short(text)}")


def _check_unit(value: Any) -> str | None:
    if value is None:
        return None
    return contract.normalize_unit(_contract_rule(contract.unit_problem, value))


def _check_health_url(value: Any) -> str | None:
    if value is None:
        return None
    text = _check_printable_line(value, "health_url")
    try:
        parts = urlsplit(text)
    except ValueError as exc:
        raise ValueError(f"health_url is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.netloc or " " in text:
        raise ValueError(f"health_url must be an http:// or https:// URL; got {short(text)}")
    return text


def _check_device(value: Any) -> int | str:
    """An index stays an int (as YAML gave it); the wire form is text either way (`to_wire`)."""
    if isinstance(value, bool):
        raise ValueError(f"a device is a GPU index (0, 1, …) or a UUID; got {short(value)}")
    return _contract_rule(contract.device_problem, value)


def _check_min_free_mib(value: Any) -> int | str:
    if value == "auto" and isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_MIN_FREE_MIB:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_MIN_FREE_MIB:
        raise ValueError(f"min_free_mib must be at most {MAX_MIN_FREE_MIB} MiB (16 TiB, more than any GPU has); "
                         f"got {short(value)}")
    raise ValueError(f"min_free_mib must be a number of MiB (>= 0) or `auto`; got {short(value)}")


def _check_script(value: Any) -> str | None:
    if value is None:
        return None
    return _contract_rule(contract.script_problem, _check_printable_line(value, "script"))


def _check_file_glob(value: Any) -> str:
    """A glob relative to the job file, inside its folder (the files land beside the script)."""
    text = _check_printable_line(value, "a payload.files glob")
    if not text or text.startswith("/") or ".." in text.split("/"):
        raise ValueError(f"a payload.files glob is relative to the job file, without `..`; got {short(text)}")
    return text


def _check_arg_value(value: Any) -> Any:
    scalar = (str, int, float, bool)
    if isinstance(value, list):
        if not value or not all(isinstance(v, scalar) and not isinstance(v, bool) for v in value):
            raise ValueError("a list argument must be a non-empty list of strings or numbers")
        return [_check_text(v, "an argument") if isinstance(v, str) else v for v in value]
    if value is None or isinstance(value, scalar):
        return _check_text(value, "an argument") if isinstance(value, str) else value
    raise ValueError(f"an argument must be a string, number, true/false/null, or a list; got {kind(value)}")


def _check_arg_key(value: Any) -> str:
    if not isinstance(value, str) or not _ARG_KEY_RE.fullmatch(value):
        raise ValueError(f"argument names must match [A-Za-z0-9_-]+; got {short(value)}")
    return value


def _check_env_key(value: Any) -> str:
    return _contract_rule(contract.env_key_problem, value)


def _number_as_text(value: Any, what: str) -> str:
    """YAML turns `PORT: 8000` into an int; env and argv want text, so numbers (not booleans) become str."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string or a number; got {kind(value)} (quote it)")
    return _check_text(value, what)


EnvKey = Annotated[str, BeforeValidator(_check_env_key)]
EnvValue = Annotated[str, BeforeValidator(lambda v: _number_as_text(v, "an environment value")),
                     WithJsonSchema({"type": ["string", "number"]})]
ArgKey = Annotated[str, BeforeValidator(_check_arg_key)]
Scalar = str | int | float | bool | None
ArgValue = Annotated[Scalar | list[str | int | float], BeforeValidator(_check_arg_value)]
CommandWord = Annotated[str, BeforeValidator(lambda v: _number_as_text(v, "a command word")),
                        WithJsonSchema({"type": ["string", "number"]})]
Device = Annotated[int | str, BeforeValidator(_check_device)]
Name = Annotated[str, BeforeValidator(_check_name)]
User = Annotated[str | None, BeforeValidator(_check_user)]
PayloadUser = Annotated[str | None, BeforeValidator(_check_payload_user)]
HostRoot = Annotated[str, BeforeValidator(_check_host_root)]
Python = Annotated[str, BeforeValidator(_check_python)]
Unit = Annotated[str | None, BeforeValidator(_check_unit)]
HealthUrl = Annotated[str | None, BeforeValidator(_check_health_url)]
MinFreeMib = Annotated[int | Literal["auto"], BeforeValidator(_check_min_free_mib), WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_MIN_FREE_MIB}, {"const": "auto", "type": "string"}]})]
Script = Annotated[str | None, BeforeValidator(_check_script)]
FileGlob = Annotated[str, BeforeValidator(_check_file_glob)]


