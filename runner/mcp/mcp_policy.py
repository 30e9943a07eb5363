"""What an agent may ask of `runner mcp`: the server's trust model (docs/agents-ci.md, "Trust model").

An MCP server is how an agent gets less than a shell. By default it runs only the project's own job files (the
server's `jobs/` at start, or each `--jobs-dir`) and lets a call change only a benchmark's parameters: values
of the payload arguments the job file names, the sweep over them, the limits, the GPU section, the name; never
what runs or where; and the values are data (numbers, plain tokens, or values the job file lists), never code.
It reads results by job id only and baselines only from the baselines dirs, contacts `local` (the server's
own machine) only with --allow-local, and restores only the services of known job files. Each refusal is a
NotAllowed (exit 2) whose hint names the flag that would allow it.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from remote_payload.contract import normalize_unit, unit_problem

from ..errors import NotAllowed, SpecError

if TYPE_CHECKING:
    from ..spec.spec import JobSpec

# Keys a call may --set without --allow-overrides (a key and everything under it).
PARAMETER_KEYS = ("name", "payload.args", "sweep", "limits", "gpu")
JOB_FILE_SUFFIXES = (".yaml", ".yml")
BASELINE_SUFFIXES = (".json",)
# A value a call may set without --allow-overrides: a number, or a word of these characters (no shell, path or
# option syntax: no space, quote, `;`, `$`, `/`, and no leading `-` or `.`).
DATA_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class Policy:
    jobs_dirs: tuple[Path, ...]
    baselines_dirs: tuple[Path, ...] = ()
    allow_overrides: bool = False
    allow_local: bool = False

    @classmethod
    def for_project(cls, cwd: Path, jobs_dirs: Sequence[str] = (), baselines_dirs: Sequence[str] = (),
                    **allow: bool) -> Policy:
        """The dirs as given (relative to cwd), else cwd's jobs/ and baselines/."""
        return cls(tuple(cwd / d for d in jobs_dirs) or (cwd / "jobs",),
                   tuple(cwd / d for d in baselines_dirs) or (cwd / "baselines",), **allow)

    def job_file(self, name: str) -> str:
        """The job file NAME (relative to the server's cwd or to a jobs dir) if it lies in a jobs dir."""
        found = _inside(name, self.jobs_dirs, JOB_FILE_SUFFIXES)
        if found is None:
            raise NotAllowed(f"job_file {_short(name)} is not a job file in {_names(self.jobs_dirs)}",
                             hint="Start the server with --jobs-dir DIR (repeatable) to allow the job files in DIR.")
        return found

    def baseline(self, name: str) -> str:
        found = _inside(name, self.baselines_dirs, BASELINE_SUFFIXES)
        if found is None:
            raise NotAllowed(f"baseline {_short(name)} is not a .json file in {_names(self.baselines_dirs)}",
                             hint="Start the server with --baselines-dir DIR (repeatable) to allow the baselines "
                                  "in DIR.")
        return found

    def overrides(self, overrides: Iterable[str]) -> list[str]:
        overrides = list(overrides)
        if self.allow_overrides:
            return overrides
        for override in overrides:
            key = override.partition("=")[0].strip()
            if not any(key == k or key.startswith(k + ".") for k in PARAMETER_KEYS):
                raise NotAllowed(f"override {_short(key)} may change what runs or where; without --allow-overrides "
                                 f"a call may set only {', '.join(k + '.*' for k in PARAMETER_KEYS[1:])} and name",
                                 hint="Start the server with --allow-overrides to allow any override.")
        return overrides

    def arguments(self, as_written: JobSpec, overridden: JobSpec) -> None:
        """Without --allow-overrides a call sets values of the payload arguments the job file names, never new
        ones (a script's other options may be paths: `--out`, a cache dir), by args or by the sweep alike."""
        added = sorted(_argument_names(overridden) - _argument_names(as_written))
        if added and not self.allow_overrides:
            raise NotAllowed(f"payload argument{'s' if len(added) > 1 else ''} {', '.join(map(_short, added))} "
                             "not named in the job file's payload.args or sweep",
                             hint="Name it in the job file, or start the server with --allow-overrides.")
        self.values(as_written, overridden)

    def values(self, as_written: JobSpec, overridden: JobSpec) -> None:
        """Without --allow-overrides every value a call sets is data, never code: a number, a plain token
        (DATA_TOKEN), or one of the values the job file itself lists (a command may put a value into a shell
        script, a script may use it in a path)."""
        if self.allow_overrides:
            return
        listed = set(map(_value_key, _values(as_written)))
        for value in _values(overridden):
            if not _is_data(value) and _value_key(value) not in listed:
                raise NotAllowed(f"value {_short(str(value))} is not a number, a plain token ([A-Za-z0-9._-], "
                                 "starting with a letter or digit) or one of the values the job file lists",
                                 hint="List the value in the job file, or start the server with --allow-overrides.")

    def host(self, host: dict) -> None:
        addresses = host["address"] if isinstance(host["address"], list) else [host["address"]]
        if "local" in addresses and not self.allow_local:
            raise NotAllowed("host.address is `local`: a job would run on the MCP server's own machine",
                             hint="Start the server with --allow-local to allow jobs and restores on this machine.")

    def known_service(self, address: str, unit: str) -> str:
        """The job file in the jobs dirs whose host.address and service.unit these are."""
        problem = unit_problem(unit)
        if problem:
            raise SpecError(f"unit: {problem}")
        wanted = normalize_unit(unit)
        for path, spec in self._job_specs():
            addresses = spec.host.address if isinstance(spec.host.address, list) else [spec.host.address]
            if address in addresses and wanted in (normalize_unit(s.unit) for s in spec.all_services() if s.unit):
                return str(path)
        raise NotAllowed(f"{wanted} on {_short(address)} is not the service of any job file in "
                         f"{_names(self.jobs_dirs)}",
                         hint="Give job_file, or start the server with --jobs-dir DIR where a job file names that "
                              "host and unit.")

    def _job_specs(self) -> Iterator[tuple[Path, JobSpec]]:
        from ..spec.spec_load import load_spec

        for directory in self.jobs_dirs:
            for path in sorted(p for p in directory.glob("*") if p.suffix in JOB_FILE_SUFFIXES):
                if _inside(str(path), self.jobs_dirs, JOB_FILE_SUFFIXES) is None:
                    continue  # a link out of the dir
                try:
                    yield path, load_spec(path)
                except SpecError:
                    continue


def _values(spec: JobSpec) -> Iterator[object]:
    """Every scalar a call can set that reaches the payload: the name, payload.args and the sweep's values."""
    todo: list[object] = [spec.name, spec.payload.args]
    if spec.sweep is not None:
        todo += [spec.sweep.matrix, spec.sweep.include]
    while todo:
        value = todo.pop()
        if isinstance(value, dict):
            todo.extend(value.values())
        elif isinstance(value, (list, tuple)):
            todo.extend(value)
        else:
            yield value


def _is_data(value: object) -> bool:
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, (int, float)):
        return math.isfinite(value)
    return isinstance(value, str) and DATA_TOKEN.fullmatch(value) is not None


def _value_key(value: object) -> tuple[str, str]:
    """A value as it compares with the job file's own (1 and 1.0 and True stay apart)."""
    return type(value).__name__, repr(value)


def _argument_names(spec: JobSpec) -> set[str]:
    names = set(spec.payload.args)
    if spec.sweep is not None:
        names |= set(spec.sweep.matrix) | {name for variant in spec.sweep.include for name in variant}
    return names


def _inside(name: str, dirs: Sequence[Path], suffixes: tuple[str, ...]) -> str | None:
    """NAME resolved (links followed) if it is a regular file with one of the suffixes inside one of dirs."""
    roots = [d.resolve() for d in dirs]
    given = Path(name)
    for candidate in [given] + ([d / given for d in dirs] if not given.is_absolute() else []):
        try:
            resolved = candidate.resolve()
            if (resolved.suffix in suffixes and resolved.is_file()
                    and any(resolved.is_relative_to(root) for root in roots)):
                return str(resolved)
        except (OSError, ValueError, RuntimeError):  # a NUL, a loop of links, no permission
            continue
    return None


def _names(dirs: Sequence[Path]) -> str:
    return ", ".join(str(d) for d in dirs) or "(none)"


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")
