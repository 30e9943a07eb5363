"""Reading a job spec: the YAML file (bounded, UTF-8, no duplicate keys), `--set a.b=value` overrides, and
every failure rendered as a SpecError whose lines read `FILE: field.path: what is wrong`."""
from __future__ import annotations

import json
import re
import stat
from collections.abc import Hashable
from pathlib import Path
from typing import Any, Sequence, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .errors import SpecError
from .spec import JobSpec
from .spec_fields import kind, short

MAX_SPEC_BYTES = 1 << 20

SectionT = TypeVar("SectionT", bound=BaseModel)


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
    spec.set_spec_path(path)
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
        raise SpecError(f"{path}: the top level must be a mapping (name:, host:, payload:, …); got {kind(document)}")
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
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {short(key)}", key_node.start_mark)
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
