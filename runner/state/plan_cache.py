"""A submit's local plan, cached by everything it came from: a warm `runner submit` of a spec it has planned
before neither imports pydantic and yaml nor validates again (they were most of the CLI's start-up).

A plan is what submit decides before any host is contacted: the host section, the wire form of the spec
(its job id left to each submit), the payload script's path, the digests of both bundles (the supervisor's and
the payload's), the args check's note, and a fleet's rollout section (commands/plan.py is the object a command
passes down).
Its key hashes the spec file (resolved path and bytes), the `--set` overrides, and a stamp of the code that
validates (every runner/**/*.py file, the Python version, the pydantic and yaml packages): any change is a
miss, so a plan is never older than what it was made from. On a hit both bundles are built again from the files
and must hash to the recorded digests (the host code, the script and its local imports unchanged: a payload's
estimate and args check are as fresh as its bundle), else it is a miss too.
Entries are STATE/plans/<key>.json, replaced atomically; an unreadable one is a miss, never an error. The
last plan of each file and overrides is kept as STATE/plans/last-<hash>.json too (latest_key): a guess an
edited spec's submit may open its host call on while it validates, never used unchecked.
"""
from __future__ import annotations

import json
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..errors import RunnerError
from .store import write_cache

FORMAT = 3
RUNNER_DIR = Path(__file__).resolve().parents[1]  # the whole runner package, every sub-package
VALIDATING_PACKAGES = ("pydantic", "pydantic_core", "yaml")
# A job file over this is not keyed (nor read whole): validation refuses it (spec_load.MAX_SPEC_BYTES).
MAX_KEYED_BYTES = 1 << 20


@dataclass
class Plan:
    host: dict
    wire: dict  # the spec's wire form; its job_id is set by each submit
    source: str | None  # the payload script (absolute), or None for a command payload
    digest: str  # the supervisor's bundle
    payload_digest: str | None  # the payload script's bundle (its import closure), or None
    args_note: str
    rollout: dict | None  # a fleet's rollout section, defaults filled in; None for one host


def key(spec_path: str, overrides: Sequence[str]) -> str | None:
    """The plan's key, or None when the spec is not a readable regular file (validation then says why)."""
    path = Path(spec_path).resolve()
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_KEYED_BYTES:
            return None
        with open(path, "rb") as fh:
            data = fh.read(MAX_KEYED_BYTES + 1)
    except (OSError, ValueError):
        return None
    if len(data) > MAX_KEYED_BYTES:  # grew since the stat
        return None
    import hashlib  # a submit's: the commands that make no plan never load OpenSSL

    h = hashlib.sha256(json.dumps([FORMAT, str(path), list(overrides), _code_stamp()]).encode())
    h.update(data)
    return h.hexdigest()[:32]


def latest_key(spec_path: str, overrides: Sequence[str]) -> str:
    """Names the last plan made from this file and these overrides, whatever the file's bytes were then: a
    guess only (a submit of the file as edited since may open its host call on it, and checks it after)."""
    import hashlib

    named = json.dumps([FORMAT, str(Path(spec_path).resolve()), list(overrides)]).encode()
    return "last-" + hashlib.sha256(named).hexdigest()[:32]


def _code_stamp() -> list:
    """What validation depends on besides the spec: runner's own files and the validating packages."""
    files = sorted(RUNNER_DIR.rglob("*.py")) + [_package_file(name) for name in VALIDATING_PACKAGES]
    return [sys.version] + [_file_stamp(path) for path in files]


def _package_file(name: str) -> Path | None:
    from importlib.util import find_spec

    spec = find_spec(name)
    return Path(spec.origin) if spec is not None and spec.origin else None


def _file_stamp(path: Path | None) -> list:
    if path is None:
        return [str(path), None]
    try:
        st = path.stat()
        return [str(path), st.st_size, st.st_mtime_ns]
    except OSError:
        return [str(path), None]


def _read(root: Path, plan_key: str | None) -> Plan | None:
    if plan_key is None:
        return None
    try:
        return Plan(**json.loads((root / "plans" / f"{plan_key}.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def load(root: Path, plan_key: str | None, bundles_of: Callable) -> tuple[Plan, tuple] | None:
    """The cached plan and its bundles (`bundles_of(source)`: the supervisor's and the payload's, each checked
    against its recorded digest), or None."""
    plan = _read(root, plan_key)
    if plan is None:
        return None
    try:
        bundle, payload = bundles_of(Path(plan.source) if plan.source else None)
    except (OSError, ValueError, TypeError, RunnerError):
        return None
    payload_digest = payload.digest if payload is not None else None
    return (plan, (bundle, payload)) if (bundle.digest, payload_digest) == (plan.digest, plan.payload_digest) else None


def save(root: Path, plan_key: str | None, plan: Plan, latest: str | None = None) -> None:
    """Record a plan under its key, and under `latest` (latest_key) when given (best effort: a read-only
    state dir only costs the next submit its validation)."""
    for name in (plan_key, latest):
        if name is not None:  # 0600: a plan holds payload.env
            write_cache(root / "plans" / f"{name}.json", json.dumps(plan.__dict__))
