"""Reading a job spec: the YAML file (bounded, UTF-8, no duplicate keys, aliases expanding to at most
MAX_EXPANDED_VALUES), `--set a.b=value` overrides, and every failure rendered as a SpecError whose lines read
`FILE: field.path: what is wrong`.

A file that is not a job spec (no top-level key is one of the spec's) gets one line that quotes none of its
text: the loader may be pointed at any file (an agent's tool call, a typo), and its content must not come
back in an error. In a job spec an unknown top-level key is quoted only when it looks like a key someone
would type (QUOTABLE_KEY), else named by its line."""
from __future__ import annotations

import json
import re
import stat
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from ..errors import SpecError
from .spec import JobSpec
from .spec_fields import kind

MAX_SPEC_BYTES = 1 << 20
# What the document's aliases may expand to, in YAML nodes: a job spec has a few hundred; a 400-byte
# "billion laughs" file has billions, which any walk of the value (validation, a message) would pay for.
MAX_EXPANDED_VALUES = 100_000
QUOTABLE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,40}")
# PyYAML's messages quote a name from the text after these words: not shown, like any other content.
_NAMED = re.compile(r"""\b(alias|anchor|tag|tag handle) (?:'[^']*'|"[^"]*")""")

SectionT = TypeVar("SectionT", bound=BaseModel)


def load_spec(path: str | Path, overrides: Sequence[str] = ()) -> JobSpec:
    """Read, override (`--set a.b=value`) and validate a job spec; every failure is a SpecError naming FILE."""
    path = Path(path)
    document, key_lines = _parse_yaml(path, _read_text(path))
    _refuse_other_files(path, document)
    for override in overrides:
        _apply_override(document, override, path)
    try:
        spec = JobSpec.model_validate(document)
    except ValidationError as exc:
        raise SpecError(_describe_errors(path, exc.errors(), key_lines=key_lines)) from None
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


def _parse_yaml(path: Path, text: str) -> tuple[dict, dict]:
    """The document and the line of each of its top-level keys (for keys that are not quoted)."""
    loader = None
    try:
        loader = _UniqueKeyLoader(text)  # its reader refuses control characters already
        document = loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = exc.problem or exc.context or "invalid YAML"
        if not isinstance(exc, _Refused):
            problem = _NAMED.sub(r"\1 (not shown)", problem)
        raise SpecError(f"{where}: {_one_line(problem)}") from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        # PyYAML raises ValueError for impossible dates (2026-02-30) and RecursionError for deep nesting.
        raise SpecError(f"{path}: invalid YAML: {_one_line(str(exc) or type(exc).__name__)}") from None
    finally:
        if loader is not None:
            loader.dispose()
    if not isinstance(document, dict):
        raise SpecError(f"{path}: the top level must be a mapping (name:, host:, payload:, …); got {kind(document)}")
    return document, loader.top_key_lines


def _refuse_other_files(path: Path, document: dict) -> None:
    if document and not any(_spec_key(key, value) for key, value in document.items()):
        raise SpecError(f"{path}: not a job spec: none of its {len(document)} top-level keys is a job spec key "
                        f"({', '.join(JobSpec.model_fields)}); its content is not shown")


def _spec_key(key: Any, value: Any) -> bool:
    """A top-level key of a job spec; a compose file's `services` (a mapping, ours is a list) is not one."""
    return isinstance(key, str) and key in JobSpec.model_fields and not (key == "services" and isinstance(value, dict))


def _key_text(key: Any) -> str | None:
    """A key as it may be quoted in a message, or None when it does not look like a key someone typed."""
    return key if isinstance(key, str) and QUOTABLE_KEY.fullmatch(key) else None


class _Refused(yaml.constructor.ConstructorError):
    """One of this loader's own rules: its message is runner's, shown as written."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key written twice in one mapping (PyYAML would silently keep the last)
    and a document whose aliases expand to more than MAX_EXPANDED_VALUES nodes (or into themselves), and
    remembers the line of each top-level key."""

    def __init__(self, stream: str | bytes) -> None:
        super().__init__(stream)
        self.top_key_lines: dict = {}
        self._top: yaml.Node | None = None

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            _expanded_size(node, {}, set())
        self._top = node
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` may legitimately repeat keys that this mapping then overrides
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                quoted = _key_text(key)
                raise _Refused(
                    None, None, f"duplicate key {quoted!r}" if quoted else "a key written twice", key_node.start_mark)
            if isinstance(key, Hashable):
                seen.add(key)
                if node is self._top:
                    self.top_key_lines.setdefault(key, key_node.start_mark.line + 1)
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node: yaml.Node, sizes: dict, active: set) -> int:
    """How many nodes `node` stands for once its aliases are expanded (each distinct node is counted once:
    a shared one is looked up). Raises ConstructorError past MAX_EXPANDED_VALUES or for an alias into itself."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in active:
        raise _Refused(None, None, "an alias refers to itself (a recursive value)",
                                                node.start_mark)
    children = node.value if isinstance(node, yaml.SequenceNode) else \
        [part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode) else []
    active.add(id(node))
    total = 1
    for child in children:
        total += _expanded_size(child, sizes, active)
        if total > MAX_EXPANDED_VALUES:
            raise _Refused(
                None, None, f"this value expands to more than {MAX_EXPANDED_VALUES} values (YAML aliases repeat "
                "what they name); a job spec is small", node.start_mark)
    active.discard(id(node))
    sizes[id(node)] = total
    return total


def _apply_override(document: dict, override: str, path: Path) -> None:
    """`a.b.c=value`: value is YAML (`5`, `true`, `[1, 2]`, `30m`); missing mappings on the way are created."""
    key, sep, raw = override.partition("=")
    keys = key.split(".")
    if not sep or not all(k.strip() == k and k for k in keys):
        raise SpecError(f"{path}: --set {override!r}: expected KEY=VALUE with a dotted KEY like payload.args.experts")
    if not raw.strip():
        # YAML reads nothing as null, which would silently drop an argument: an explicit null is written.
        raise SpecError(f"{path}: --set {override!r}: an empty value; write {key}=null for null (an argument set "
                        f"to null is left out), or {key}=\"''\" for an empty string")
    try:
        value = _load_value(raw)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise SpecError(f"{path}: --set {override!r}: the value is not valid YAML ({_one_line(str(exc))})") from None
    target = document
    for depth, name in enumerate(keys[:-1]):
        target = target.setdefault(name, {})
        if not isinstance(target, dict):
            raise SpecError(f"{path}: --set {override!r}: {'.'.join(keys[:depth + 1])} is not a mapping")
    target[keys[-1]] = value


def _load_value(raw: str) -> Any:
    """One `--set` value, read by the file's loader (its alias budget and duplicate-key rule)."""
    loader = _UniqueKeyLoader(raw)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _describe_errors(path: Path | str, errors: list[ErrorDetails], root: type[BaseModel] | None = None, limit: int = 20,
                     key_lines: dict | None = None) -> str:
    lines = [_describe_error(path, error, root or JobSpec, key_lines or {}) for error in errors[:limit]]
    if len(errors) > limit:
        lines.append(f"{path}: … and {len(errors) - limit} more errors")
    return "\n".join(lines)


def _describe_error(path: Path | str, error: ErrorDetails, root: type[BaseModel], key_lines: dict) -> str:
    loc = error["loc"]
    if len(loc) == 1 and error["type"] == "extra_forbidden" and _key_text(loc[0]) is None:
        line = key_lines.get(loc[0])
        where = f"the top-level key at line {line}" if line else "a top-level key (not shown)"
    else:
        where = ".".join(_loc_part(part) for part in loc if part != "[key]") or "(top level)"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        allowed = _allowed_keys(root, error["loc"][:-1])
        message = f"unknown key (allowed: {', '.join(allowed)})" if allowed else "unknown key"
    if where == "(top level)" and error["type"] == "value_error":  # a whole-spec rule: its message names the fields
        return f"{path}: {_one_line(message)}"
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
