"""The job spec: YAML on the controller → validated pydantic models → the JSON form the host reads.

Everything a user writes is checked here before it can reach a host (DESIGN.md invariant 3): unit names,
interpreter paths, script paths and env keys are validated by pattern, never escaped later. Every failure
of `load_spec` is a SpecError whose lines read `FILE: field.path: what is wrong`.
"""
from __future__ import annotations

import ipaddress
import json
import math
import re
import stat
import unicodedata
from collections import Counter
from collections.abc import Hashable
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, Sequence, TypeVar, Union
from urllib.parse import urlsplit

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError,
                      field_validator, model_validator)

from .errors import SpecError

MAX_SPEC_BYTES = 1 << 20
MAX_DURATION_S = 7 * 24 * 3600.0
JOB_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")

_DURATION_RE = re.compile(r"(?:(?P<d>\d+(?:\.\d+)?)d)?(?:(?P<h>\d+(?:\.\d+)?)h)?"
                          r"(?:(?P<m>\d+(?:\.\d+)?)m)?(?:(?P<s>\d+(?:\.\d+)?)s)?")
_UNIT_SECONDS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_HOSTNAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}")
_USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
_UNIT_RE = re.compile(r"[A-Za-z0-9:_.\\-]+(?:@[A-Za-z0-9:_.\\-]+)?")
# systemctl appends .service to a name without one of these suffixes; we do the same, visibly.
_UNIT_SUFFIXES = (".service", ".socket", ".device", ".mount", ".automount", ".swap", ".target", ".path",
                  ".timer", ".slice", ".scope")
_GPU_UUID_RE = re.compile(r"GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_BARE_PYTHON_RE = re.compile(r"[A-Za-z0-9._+-]+")
_ARG_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")
_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SLUG_DROP_RE = re.compile(r"[^A-Za-z0-9._]+")  # "-" too, so runs of separators collapse
_RAND_RE = re.compile(r"[0-9a-f]{6}")


# -- describing what a user gave, briefly (a value may be a megabyte long) ---------------------------------

def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


# -- durations --------------------------------------------------------------------------------------------

def parse_duration(value: Any) -> float:
    """Seconds from `90`, `2.5`, "90", "30s", "5m", "1h30m", "1d"; must be > 0 and at most 7 days.

    Raises ValueError (pydantic turns it into a field error; callers outside a model catch it).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"a duration must be a number of seconds or text like 30s, 5m, 1h30m; got {_kind(value)}")
    # ints are compared as ints: float(10**400) would overflow before the range check could refuse it
    seconds = _seconds_from_text(value) if isinstance(value, str) else value
    if isinstance(seconds, float) and math.isnan(seconds):
        raise ValueError("a duration must be a number, not NaN")
    if seconds <= 0:
        raise ValueError(f"a duration must be more than 0 seconds; got {_short(value)}")
    if seconds > MAX_DURATION_S:
        raise ValueError(f"a duration must be at most 7 days; got {_short(value)}")
    return float(seconds)


def _seconds_from_text(text: str) -> float:
    stripped = text.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", stripped):
        return float(stripped)
    match = _DURATION_RE.fullmatch(stripped)
    if not stripped or match is None:
        raise ValueError(f"not a duration: {_short(text)} (use seconds, or e.g. 30s, 5m, 1h30m, 1d)")
    return sum(float(amount) * _UNIT_SECONDS[unit] for unit, amount in match.groupdict().items() if amount)


Duration = Annotated[float, BeforeValidator(parse_duration)]


# -- field checks (each raises ValueError with a message that says what is allowed) -----------------------

def _check_text(value: Any, what: str) -> str:
    """A string for argv or a file: anything but NUL (which cannot be passed to exec)."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string; got {_kind(value)}")
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
                         f"got {_short(text)}") from None


def _check_user(value: Any) -> str | None:
    if value is None:
        return None
    text = _check_printable_line(value, "user")
    if not _USER_RE.fullmatch(text):
        raise ValueError(f"user must be a login name ([A-Za-z0-9_][A-Za-z0-9._-]*, at most 64); got {_short(text)}")
    return text


def _check_host_root(value: Any) -> str:
    text = _check_printable_line(value, "root")
    if not (text == "~" or text.startswith(("~/", "/"))):
        raise ValueError(f"root must be an absolute path or start with ~/; got {_short(text)}")
    if "$" in text or "%" in text:  # systemd-run expands both in the guard timer's command line
        raise ValueError(f"root must not contain '$' or '%'; got {_short(text)}")
    return text


def _check_python(value: Any) -> str:
    """An interpreter is argv[0]: a bare name looked up on PATH, or an absolute path; nothing relative."""
    text = _check_printable_line(value, "python")
    if text.startswith("/"):
        if ".." in PurePosixPath(text).parts:
            raise ValueError(f"python must not contain `..`; got {_short(text)}")
        return text
    if _BARE_PYTHON_RE.fullmatch(text) and text not in (".", "..") and not text.startswith("-"):
        return text
    raise ValueError(f"python must be a bare name like python3 ([A-Za-z0-9._+-]) or an absolute path; "
                     f"got {_short(text)}")


def _check_unit(value: Any) -> str | None:
    if value is None:
        return None
    text = _check_text(value, "unit")
    if not _UNIT_RE.fullmatch(text) or ".." in text or text.startswith(("-", ".", "@")) or len(text) > 240:
        raise ValueError(f"unit must be a systemd unit name (letters, digits, `:_.\\-`, one `@`; "
                         f"no `..`, not starting with `-` or `.`); got {_short(text)}")
    return text if text.endswith(_UNIT_SUFFIXES) else text + ".service"


def _check_health_url(value: Any) -> str | None:
    if value is None:
        return None
    text = _check_printable_line(value, "health_url")
    try:
        parts = urlsplit(text)
    except ValueError as exc:
        raise ValueError(f"health_url is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.netloc or " " in text:
        raise ValueError(f"health_url must be an http:// or https:// URL; got {_short(text)}")
    return text


def _check_device(value: Any) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and _GPU_UUID_RE.fullmatch(value):
        return value
    raise ValueError(f"a device is a GPU index (0, 1, …) or a UUID like GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx; "
                     f"got {_short(value)}")


def _check_min_free_mib(value: Any) -> int | str:
    if value == "auto" and isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"min_free_mib must be a number of MiB (>= 0) or `auto`; got {_short(value)}")


def _check_script(value: Any) -> str | None:
    if value is None:
        return None
    text = _check_printable_line(value, "script")
    # the same rule as the supervisor's check_script, so the host never refuses what passed here
    if text.startswith("/") or any(part in ("", ".", "..") for part in text.split("/")):
        raise ValueError(f"script must be a relative file path without `..`, `.` or empty parts; got {_short(text)}")
    return text


def _check_arg_value(value: Any) -> Any:
    scalar = (str, int, float, bool)
    if isinstance(value, list):
        if not value or not all(isinstance(v, scalar) and not isinstance(v, bool) for v in value):
            raise ValueError("a list argument must be a non-empty list of strings or numbers")
        return [_check_text(v, "an argument") if isinstance(v, str) else v for v in value]
    if value is None or isinstance(value, scalar):
        return _check_text(value, "an argument") if isinstance(value, str) else value
    raise ValueError(f"an argument must be a string, number, true/false/null, or a list; got {_kind(value)}")


def _check_arg_key(value: Any) -> str:
    if not isinstance(value, str) or not _ARG_KEY_RE.fullmatch(value):
        raise ValueError(f"argument names must match [A-Za-z0-9_-]+; got {_short(value)}")
    return value


def _check_env_key(value: Any) -> str:
    if not isinstance(value, str) or not _ENV_KEY_RE.fullmatch(value):
        raise ValueError(f"environment variable names must match [A-Za-z_][A-Za-z0-9_]*; got {_short(value)}")
    if value.startswith("RUNNER_"):
        raise ValueError(f"RUNNER_* variables are set by the supervisor and cannot be overridden; got {_short(value)}")
    return value


def _number_as_text(value: Any, what: str) -> str:
    """YAML turns `PORT: 8000` into an int; env and argv want text, so numbers (not booleans) become str."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string or a number; got {_kind(value)} (quote it)")
    return _check_text(value, what)


EnvKey = Annotated[str, BeforeValidator(_check_env_key)]
EnvValue = Annotated[str, BeforeValidator(lambda v: _number_as_text(v, "an environment value"))]
ArgKey = Annotated[str, BeforeValidator(_check_arg_key)]
Scalar = Union[str, int, float, bool, None]
ArgValue = Annotated[Union[Scalar, list[Union[str, int, float]]], BeforeValidator(_check_arg_value)]
CommandWord = Annotated[str, BeforeValidator(lambda v: _number_as_text(v, "a command word"))]
Device = Annotated[Union[int, str], BeforeValidator(_check_device)]


# -- the models -------------------------------------------------------------------------------------------

class _Section(BaseModel):
    # strict: YAML already gives typed values; "10" is not silently a port, `yes` not silently a name.
    model_config = ConfigDict(extra="forbid", strict=True)


class HostSpec(_Section):
    address: Annotated[str, BeforeValidator(_check_address)]
    user: Annotated[str | None, BeforeValidator(_check_user)] = None
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    host_key_policy: Literal["strict", "accept-new"] = "strict"
    root: Annotated[str, BeforeValidator(_check_host_root)] = "~/.runner"
    python: Annotated[str, BeforeValidator(_check_python)] = "python3"  # runs the supervisor
    connect_timeout: Duration = 10.0


class ServiceSpec(_Section):
    manager: Literal["systemd", "none"] = "none"
    unit: Annotated[str | None, BeforeValidator(_check_unit)] = None
    scope: Literal["system", "user"] = "system"
    stop: Literal["always", "if-needed", "never"] = "if-needed"
    health_url: Annotated[str | None, BeforeValidator(_check_health_url)] = None
    health_timeout: Duration = 900.0
    sudo: bool = False

    @model_validator(mode="after")
    def _unit_matches_manager(self) -> ServiceSpec:
        if self.manager == "systemd" and self.unit is None:
            raise ValueError("manager systemd needs a `unit` (e.g. sglang.service)")
        if self.manager == "none" and self.unit is not None:
            raise ValueError("`unit` is only used with `manager: systemd`")
        return self


class GpuSpec(_Section):
    devices: list[Device] = []
    min_free_mib: Annotated[Union[int, Literal["auto"]], BeforeValidator(_check_min_free_mib)] = 0
    drain_timeout: Duration = 120.0

    @field_validator("devices")
    @classmethod
    def _no_duplicate_devices(cls, devices: list[int | str]) -> list[int | str]:
        counts = Counter(str(d).lower() for d in devices)
        duplicates = sorted(d for d, n in counts.items() if n > 1)
        if duplicates:
            raise ValueError(f"devices listed twice: {', '.join(duplicates)}")
        return devices


class PayloadSpec(_Section):
    python: Annotated[str, BeforeValidator(_check_python)] = "python3"
    script: Annotated[str | None, BeforeValidator(_check_script)] = None
    args: dict[ArgKey, ArgValue] = {}
    env: dict[EnvKey, EnvValue] = {}
    command: list[CommandWord] | None = None

    @model_validator(mode="after")
    def _script_or_command(self) -> PayloadSpec:
        if (self.script is None) == (self.command is None):
            raise ValueError("give exactly one of `script` (with `args`) or `command`")
        if self.command is not None and not self.command:
            raise ValueError("`command` must not be empty")
        if self.command is not None and self.args:
            raise ValueError("`args` go with `script`; with `command`, put the arguments in the list")
        return self


class LimitsSpec(_Section):
    max_runtime: Duration = 3600.0
    grace: Duration = 30.0


class JobSpec(_Section):
    name: Annotated[str, BeforeValidator(_check_name)]
    host: HostSpec
    service: ServiceSpec = Field(default_factory=ServiceSpec)
    gpu: GpuSpec = Field(default_factory=GpuSpec)
    payload: PayloadSpec
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    _spec_path: Path | None = PrivateAttr(None)

    @property
    def spec_path(self) -> Path | None:
        """The YAML file this spec was loaded from (set by load_spec)."""
        return self._spec_path

    def payload_args(self) -> list[str]:
        """args → argv: `batch_sizes: [1, 2]` → `--batch-sizes 1,2`; true → a bare flag; false/null → left out."""
        argv: list[str] = []
        for key, value in self.payload.args.items():
            if value is False or value is None:
                continue
            argv.append("--" + key.replace("_", "-"))
            if value is not True:
                argv.append(",".join(map(str, value)) if isinstance(value, list) else str(value))
        return argv

    def script_source(self, payload_root: Path) -> Path | None:
        """The local file to upload: one of remote_payload/ if it is there, else relative to the YAML's directory."""
        script = self.payload.script
        if script is None:
            return None
        spec_dir = self._spec_path.parent if self._spec_path is not None else Path.cwd()
        for candidate in (Path(payload_root) / script, spec_dir / script):
            if candidate.is_file():
                return candidate
        raise SpecError(f"{self._spec_path or '<spec>'}: payload.script: {_short(script)} is neither in {payload_root} "
                        f"nor in {spec_dir}")

    def to_wire(self, job_id: str, required_mib: int, script_name: str | None) -> dict:
        """The normalised JSON form of docs/protocol.md ("The spec JSON"); script_name is the script's name
        inside the uploaded payload dir (defaults to payload.script)."""
        return {"name": self.name, "job_id": check_job_id(job_id), "service": self._wire_service(),
                "gpu": {"devices": [str(d) for d in self.gpu.devices], "required_mib": int(required_mib),
                        "drain_timeout": self.gpu.drain_timeout},
                "payload": self._wire_payload(script_name), "limits": self.limits.model_dump()}

    def _wire_service(self) -> dict:
        if self.service.manager == "none":
            return {"manager": "none"}
        return self.service.model_dump()

    def _wire_payload(self, script_name: str | None) -> dict:
        payload = self.payload
        script = (script_name or payload.script) if payload.script is not None else None
        return {"python": payload.python, "script": script, "args": self.payload_args(),
                "command": list(payload.command) if payload.command is not None else None, "env": dict(payload.env)}


SectionT = TypeVar("SectionT", bound=BaseModel)


# -- loading ----------------------------------------------------------------------------------------------

def load_spec(path: str | Path, overrides: Sequence[str] = ()) -> JobSpec:
    """Read, override (`--set a.b=value`) and validate a job spec; every failure is a SpecError naming FILE."""
    path = Path(path)
    document = _parse_yaml(path, _read_text(path))
    for override in overrides:
        _apply_override(document, override, path)
    try:
        spec = JobSpec.model_validate(document)
    except ValidationError as exc:
        raise SpecError(_describe_errors(path, exc.errors())) from None
    spec._spec_path = path
    return spec


def section_from_options(model: type[SectionT], source: str, **values: Any) -> SectionT:
    """One section built from command-line options (e.g. `restore-service --host H --unit U`), validated like
    a file: a bad value is a SpecError `SOURCE: field: what is wrong`, never a pydantic traceback."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise SpecError(_describe_errors(source, exc.errors(), model)) from None


def _read_text(path: Path) -> str:
    try:
        if path.is_dir():
            raise SpecError(f"{path}: is a directory, not a job spec file")
        if not stat.S_ISREG(path.stat().st_mode):
            # A FIFO or device could block the read forever; a command must never hang (invariant 2).
            raise SpecError(f"{path}: not a regular file")
        with path.open("rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # a NUL in the path
        raise SpecError(f"{str(path)!r}: not a usable path ({exc})") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(f"{path}: larger than {MAX_SPEC_BYTES} bytes; a job spec is a small YAML file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})") from None


def _parse_yaml(path: Path, text: str) -> dict:
    try:
        document = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise SpecError(f"{where}: {_one_line(exc.problem or exc.context or 'invalid YAML')}") from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        # PyYAML raises ValueError for impossible dates (2026-02-30) and RecursionError for deep nesting.
        raise SpecError(f"{path}: invalid YAML: {_one_line(str(exc) or type(exc).__name__)}") from None
    if not isinstance(document, dict):
        raise SpecError(f"{path}: the top level must be a mapping (name:, host:, payload:, …); got {_kind(document)}")
    return document


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key written twice in one mapping; PyYAML would silently keep the last."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` may legitimately repeat keys that this mapping then overrides
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {_short(key)}", key_node.start_mark)
            if isinstance(key, Hashable):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _apply_override(document: dict, override: str, path: Path) -> None:
    """`a.b.c=value`: value is YAML (`5`, `true`, `[1, 2]`, `30m`); missing mappings on the way are created."""
    key, sep, raw = override.partition("=")
    keys = key.split(".")
    if not sep or not all(k.strip() == k and k for k in keys):
        raise SpecError(f"{path}: --set {override!r}: expected KEY=VALUE with a dotted KEY like payload.args.experts")
    try:
        value = yaml.safe_load(raw)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise SpecError(f"{path}: --set {override!r}: the value is not valid YAML ({_one_line(str(exc))})") from None
    target = document
    for depth, name in enumerate(keys[:-1]):
        target = target.setdefault(name, {})
        if not isinstance(target, dict):
            raise SpecError(f"{path}: --set {override!r}: {'.'.join(keys[:depth + 1])} is not a mapping")
    target[keys[-1]] = value


def _describe_errors(path: Path | str, errors: list[dict], root: type[BaseModel] | None = None, limit: int = 20) -> str:
    lines = [_describe_error(path, error, root or JobSpec) for error in errors[:limit]]
    if len(errors) > limit:
        lines.append(f"{path}: … and {len(errors) - limit} more errors")
    return "\n".join(lines)


def _describe_error(path: Path | str, error: dict, root: type[BaseModel]) -> str:
    where = ".".join(_loc_part(part) for part in error["loc"] if part != "[key]") or "(top level)"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        allowed = _allowed_keys(root, error["loc"][:-1])
        message = f"unknown key (allowed: {', '.join(allowed)})" if allowed else "unknown key"
    return f"{path}: {where}: {_one_line(message)}"


def _allowed_keys(root: type[BaseModel], section: tuple) -> list[str]:
    """The keys a section takes, so a typo's error shows the right spelling."""
    model: Any = root
    for name in section:
        field = model.model_fields.get(name) if isinstance(name, str) else None
        model = field.annotation if field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
    return list(model.model_fields)


def _loc_part(part: Any) -> str:
    """Keys a user wrote appear as written, quoted when they would break the one-line message."""
    text = str(part)
    if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", text):
        return text
    return json.dumps(text if len(text) <= 64 else text[:61] + "...")


def _one_line(text: str) -> str:
    return " ".join(text.split())


# -- job ids ----------------------------------------------------------------------------------------------

def job_id_for(name: str, now: datetime, rand: str) -> str:
    """`<slug of name>-YYYYmmdd-HHMMSS-<rand>`: readable in `runner list`, unique by time and 6 random hex."""
    if not _RAND_RE.fullmatch(rand):
        raise ValueError(f"rand must be 6 lowercase hex digits; got {rand!r}")
    return check_job_id(f"{_slug(name)}-{now.strftime('%Y%m%d-%H%M%S')}-{rand}")


def _slug(name: str) -> str:
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    slug = _SLUG_DROP_RE.sub("-", ascii_name).strip("-.")[:40].rstrip("-.")
    return slug or "job"


def check_job_id(job_id: Any) -> str:
    """Job ids become directory names and argv words on the host: [A-Za-z0-9._-], not `.`/`..`, no leading `-`."""
    valid = isinstance(job_id, str) and JOB_ID_RE.fullmatch(job_id) and job_id not in (".", "..")
    if not valid or job_id.startswith("-"):
        raise SpecError(f"bad job id {_short(job_id)}: use 1 to 128 of [A-Za-z0-9._-], not `.` or `..`, "
                        f"not starting with `-`")
    return job_id
