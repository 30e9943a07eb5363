"""The job spec: the pydantic models a YAML job file must fit, and the JSON form the host reads (`to_wire`).
What each key is for is written once, in spec_reference.DESCRIPTIONS (docs/spec-reference.md).

Everything a user writes is checked before it can reach a host (DESIGN.md invariant 3): unit names,
interpreter paths, script paths and env keys are validated by pattern, never escaped later. The field rules
live in spec_fields.py (the shared ones come from remote_payload/contract.py, as do the defaults); reading
YAML, `--set` and error rendering in spec_load.py; job ids in job_id.py.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from remote_payload import sweep as sweeps
from remote_payload.contract import (
    DEFAULTS,
    DRAIN_FALLBACKS,
    FREE_METHODS,
    KEY_FIELDS,
    MAX_DRAIN_TIMEOUT_S,
    PAUSE_MODES,
    USER_SCOPE_SUDO,
    Launcher,
    ServiceManager,
    ServiceScope,
    StopPolicy,
    key_ref_problem,
    normalize_unit,
    origin,
)
from remote_payload.slurm.batch import MAX_DOWNTIME_ON_SLURM, setup_seconds, time_limit_minutes, time_problem

from ..errors import SpecError
from ..state.job_id import check_job_id
from .spec_fields import (
    ArgKey,
    ArgValue,
    CommandWord,
    Device,
    Duration,
    EnvKey,
    EnvValue,
    FileGlob,
    HealthUrl,
    HostRoot,
    MinFreeMib,
    Name,
    PayloadUser,
    Python,
    Script,
    Unit,
    User,
    short,
)
from .spec_fleet import Addresses, RolloutSpec
from .spec_slurm import SlurmSpec, minutes


class _Section(BaseModel):
    # strict: YAML already gives typed values; "10" is not silently a port, `yes` not silently a name.
    model_config = ConfigDict(extra="forbid", strict=True)


class HostSpec(_Section):
    address: Addresses  # one host, or a list of them (spec_fleet.py)
    user: User = None
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    host_key_policy: Literal["strict", "accept-new"] = "strict"
    root: HostRoot = DEFAULTS["host.root"]
    python: Python = "python3"  # runs the supervisor (the controller's choice: the host never defaults it)
    connect_timeout: Duration = 10.0
    transport: Literal["auto", "openssh", "paramiko"] = "auto"


class ServiceSpec(_Section):
    manager: ServiceManager = DEFAULTS["service.manager"]
    unit: Unit = None
    scope: ServiceScope = DEFAULTS["service.scope"]
    stop: StopPolicy = DEFAULTS["service.stop"]
    health_url: HealthUrl = None
    health_timeout: Duration = DEFAULTS["service.health_timeout"]
    sudo: bool = DEFAULTS["service.sudo"]
    # mypy reads a Literal only written out; pydantic takes the tuple.
    free: Literal[FREE_METHODS] = "stop"  # type: ignore[valid-type]
    api_url: HealthUrl = None
    pause_mode: Literal[PAUSE_MODES] | None = None  # type: ignore[valid-type]  # as `free`
    drain_timeout: Annotated[Duration, Field(le=MAX_DRAIN_TIMEOUT_S)] | None = None
    drain_fallback: Literal[DRAIN_FALLBACKS] | None = None  # type: ignore[valid-type]  # as `free`
    api_key: str | None = None  # where the key lives on the host (file:PATH, env:NAME), never the key
    admin_api_key: str | None = None
    gpus: list[Device] = list(DEFAULTS["service.gpus"])

    @model_validator(mode="after")
    def _unit_matches_manager(self) -> ServiceSpec:
        if self.manager == "systemd" and self.unit is None:
            raise ValueError("manager systemd needs a `unit` (e.g. sglang.service)")
        if self.manager == "none" and self.unit is not None:
            raise ValueError("`unit` is only used with `manager: systemd`")
        if self.scope == "user" and self.sudo:
            raise ValueError(USER_SCOPE_SUDO)
        if self.gpus and self.manager != "systemd":
            raise ValueError("`gpus` are the GPUs a `manager: systemd` service holds")
        duplicates = sorted(d for d, n in Counter(str(g).lower() for g in self.gpus).items() if n > 1)
        if duplicates:
            raise ValueError(f"gpus listed twice: {', '.join(duplicates)}")
        return self

    @field_validator(*KEY_FIELDS)
    @classmethod
    def _names_where_the_key_lives(cls, value: str | None, info: ValidationInfo) -> str | None:
        problem = key_ref_problem(str(info.field_name), value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _free_through_an_api(self) -> ServiceSpec:
        if self.free == "stop":
            if (self.api_url is not None or self.pause_mode is not None or self.drain_timeout is not None
                    or self.drain_fallback is not None or self.api_key is not None or self.admin_api_key is not None):
                raise ValueError("`api_url`, `pause_mode`, `drain_timeout`, `drain_fallback`, `api_key` and "
                                 "`admin_api_key` go with `free: sglang` or `free: vllm`")
            return self
        if self.manager != "systemd":
            raise ValueError(f"`free: {self.free}` needs `manager: systemd` (the unit is restarted when the "
                             "engine's API does not bring it back)")
        if self.api_url is None and self.health_url is None:
            raise ValueError(f"`free: {self.free}` needs `api_url` (or a `health_url` on the engine's port)")
        if (self.pause_mode is not None or self.drain_timeout is not None
                or self.drain_fallback is not None) and self.free != "sglang":
            raise ValueError("`pause_mode`, `drain_timeout` and `drain_fallback` are SGLang's: they go with "
                             "`free: sglang`")
        if self.drain_fallback is not None and self.pause_mode not in (None, "drain"):
            raise ValueError(f"`drain_fallback` is what the drain does past `drain_timeout`; `pause_mode: "
                             f"{self.pause_mode}` does not drain")
        return self

    def wire(self) -> dict:
        """The host's form: without the engine keys for `free: stop` and without `gpus` when none are listed
        (to_wire: what is unset stays out); api_url resolved; GPUs as text, like gpu.devices."""
        gpus = {"gpus": [str(g) for g in self.gpus]} if self.gpus else {}
        if self.free == "stop":
            return dict(self.model_dump(exclude={"free", "api_url", "pause_mode", "drain_timeout", "drain_fallback",
                                                 "gpus", *KEY_FIELDS}), **gpus)
        unset = {key for key in ("drain_timeout", "drain_fallback", *KEY_FIELDS) if getattr(self, key) is None}
        api_url = self.api_url
        if not api_url:
            assert self.health_url is not None  # _free_through_an_api: an engine service has one of the two
            api_url = origin(self.health_url)
        return dict(self.model_dump(exclude={"gpus"} | unset), api_url=api_url.rstrip("/"), **gpus)


class GpuSpec(_Section):
    devices: list[Device] = []
    min_free_mib: MinFreeMib = DEFAULTS["gpu.required_mib"]
    drain_timeout: Duration = DEFAULTS["gpu.drain_timeout"]

    @field_validator("devices")
    @classmethod
    def _no_duplicate_devices(cls, devices: list[int | str]) -> list[int | str]:
        counts = Counter(str(d).lower() for d in devices)
        duplicates = sorted(d for d, n in counts.items() if n > 1)
        if duplicates:
            raise ValueError(f"devices listed twice: {', '.join(duplicates)}")
        return devices


class PayloadSpec(_Section):
    python: Python = DEFAULTS["payload.python"]
    script: Script = None
    args: dict[ArgKey, ArgValue] = {}
    env: dict[EnvKey, EnvValue] = {}
    command: list[CommandWord] | None = None
    prepare_args: dict[ArgKey, ArgValue] | None = None
    prepare_command: list[CommandWord] | None = None
    staged: bool = False
    user: PayloadUser = None
    files: list[FileGlob] = []

    @model_validator(mode="after")
    def _script_or_command(self) -> PayloadSpec:
        if (self.script is None) == (self.command is None):
            raise ValueError("give exactly one of `script` (with `args`) or `command`")
        if self.command is not None and not self.command:
            raise ValueError("`command` must not be empty")
        if self.command is not None and self.args:
            raise ValueError("`args` go with `script`; with `command`, put the arguments in the list")
        if self.prepare_args is not None and self.script is None:
            raise ValueError("`prepare_args` go with `script`; with `command`, give `prepare_command`")
        if self.prepare_command is not None and (self.command is None or not self.prepare_command):
            raise ValueError("`prepare_command` goes with `command` and must not be empty")
        if self.files and self.script is None:
            raise ValueError("`files` go with `script` (they travel beside it); a `command` runs what the host has")
        return self


class LimitsSpec(_Section):
    max_runtime: Duration = DEFAULTS["limits.max_runtime"]
    grace: Duration = DEFAULTS["limits.grace"]
    prepare_timeout: Duration = DEFAULTS["limits.prepare_timeout"]
    queue_timeout: Duration = DEFAULTS["limits.queue_timeout"]
    stage_timeout: Duration = DEFAULTS["limits.stage_timeout"]
    max_downtime: Duration | None = DEFAULTS["limits.max_downtime"]


class SweepSpec(_Section):
    """Many variants of a script payload in one downtime window: each variant's keys become its args."""
    matrix: dict[ArgKey, Annotated[list[ArgValue], Field(min_length=1)]] = {}
    include: list[dict[ArgKey, ArgValue]] = []
    fail_fast: bool = False
    max_parallel: Annotated[int, Field(ge=1)] | None = None
    gpus_per_variant: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _some_within_the_cap(self) -> SweepSpec:
        n = sweeps.count(self.matrix, self.include)
        if n == 0:
            raise ValueError("a sweep needs a `matrix` axis or an `include` entry")
        if n > sweeps.MAX_VARIANTS:
            raise ValueError(f"{n} variants is over the cap of {sweeps.MAX_VARIANTS}; split the sweep")
        return self

    def variants(self) -> list[dict]:
        return sweeps.expand(self.matrix, self.include)


Column = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")]


class MetricsSpec(_Section):
    """Which columns of the result's `rows` the regression gate and the history compare (results/gate.py)."""
    key: Column
    lower: list[Column] = []
    higher: list[Column] = []

    @model_validator(mode="after")
    def _each_column_once(self) -> MetricsSpec:
        columns = self.lower + self.higher
        if not columns:
            raise ValueError("name the columns to compare: `lower` (lower is better), `higher`, or both")
        twice = sorted({c for c in columns if columns.count(c) > 1} | ({self.key} & set(columns)))
        if twice:
            raise ValueError(f"each column once, and not the key: {', '.join(twice)}")
        return self


class JobSpec(_Section):
    name: Name
    host: HostSpec
    service: ServiceSpec = Field(default_factory=ServiceSpec)
    services: Annotated[list[ServiceSpec], Field(min_length=1)] | None = None
    gpu: GpuSpec = Field(default_factory=GpuSpec)
    payload: PayloadSpec
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    launcher: Launcher = "ssh"
    slurm: SlurmSpec | None = None
    sweep: SweepSpec | None = None
    rollout: RolloutSpec | None = None
    metrics: MetricsSpec | None = None
    _spec_path: Path | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _launcher_rules(self) -> JobSpec:
        problem = launcher_problem(self) or fleet_problem(self)
        if problem:
            raise ValueError(problem)
        if self.sweep is not None and self.payload.staged:
            raise ValueError("payload.staged goes without a sweep: the variants run one after another in the "
                             "window, none of them staged")
        if self.sweep is not None and self.launcher == "ssh" and self.sweep.max_parallel is not None:
            raise ValueError("sweep.max_parallel is for launcher slurm (a job array); on one host the variants "
                             "share gpu.devices out with sweep.gpus_per_variant")
        if self.sweep is not None and self.sweep.gpus_per_variant is not None:
            if self.launcher != "ssh":
                raise ValueError("sweep.gpus_per_variant is for launcher ssh (Slurm hands out the GPUs: "
                                 "sweep.max_parallel)")
            problem = sweeps.slot_problem([str(d) for d in self.gpu.devices], self.sweep.gpus_per_variant)
            if problem:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _services_listed_once(self) -> JobSpec:
        if self.services is None:
            return self
        if "service" in self.model_fields_set:
            raise ValueError("give `service` (one) or `services` (a list), not both")
        for index, service in enumerate(self.services):
            if service.manager != "systemd":
                raise ValueError(f"services.{index}: each listed service needs `manager: systemd`")
        units = Counter(normalize_unit(s.unit) for s in self.services if s.unit is not None)  # systemd: all have one
        twice = sorted(u for u, n in units.items() if n > 1)
        if twice:
            raise ValueError(f"services: {', '.join(twice)} listed twice")
        return self

    def all_services(self) -> list[ServiceSpec]:
        """Every service the spec declares on the host (its systemd ones), in order."""
        if self.services is not None:
            return list(self.services)
        return [self.service] if self.service.manager == "systemd" else []

    @model_validator(mode="after")
    def _sweep_keys_used(self) -> JobSpec:
        if self.sweep is None or self.payload.command is None:
            return self
        sections: list[Mapping[str, object]] = [self.sweep.matrix, *self.sweep.include]
        keys = dict.fromkeys(k for v in sections for k in v)
        unused = sweeps.unused_keys(self.payload.command, keys)
        if unused:
            where = "sweep.matrix" if unused[0] in self.sweep.matrix else "sweep.include"
            raise ValueError(f"{where}.{unused[0]}: no `{{{unused[0]}}}` in payload.command uses it "
                             "(write the placeholder in an argument)")
        return self

    def variant_args(self) -> list[dict]:
        """Each variant's full args: `payload.args` with the variant's keys over them ([] without a sweep)."""
        return [] if self.sweep is None else [{**self.payload.args, **v} for v in self.sweep.variants()]

    @property
    def spec_path(self) -> Path | None:
        """The YAML file this spec was loaded from (set by load_spec)."""
        return self._spec_path

    @property
    def spec_dir(self) -> Path:
        """The job file's folder: what payload.script and payload.files are relative to."""
        return (self._spec_path.parent if self._spec_path is not None else Path.cwd()).absolute()

    def set_spec_path(self, path: Path) -> None:
        """Remember the YAML file (for error messages and a script relative to it); load_spec calls it."""
        self._spec_path = path

    def payload_args(self, args: dict | None = None) -> list[str]:
        """args → argv: `batch_sizes: [1, 2]` → `--batch-sizes 1,2`; true → a bare flag; false/null → left out."""
        argv: list[str] = []
        for key, value in (self.payload.args if args is None else args).items():
            if value is False or value is None:
                continue
            argv.append("--" + key.replace("_", "-"))
            if value is not True:
                argv.append(",".join(map(str, value)) if isinstance(value, list) else str(value))
        return argv

    def script_source(self, payload_root: Path) -> Path | None:
        """The local file to upload: in payload_root (the packaged payload holding a bare name) if it is there,
        else relative to the YAML's directory."""
        script = self.payload.script
        if script is None:
            return None
        spec_dir = self.spec_dir
        for candidate in (Path(payload_root) / script, spec_dir / script):
            if candidate.is_file():
                return candidate
        raise SpecError(f"{self._spec_path or '<spec>'}: payload.script: {short(script)} is not in {spec_dir} "
                        f"(a script is found beside the job file, or by its name among runner's payloads in "
                        f"{payload_root})")

    def to_wire(self, job_id: str, required_mib: int, script_name: str | None) -> dict:
        """The normalised JSON form of docs/protocol.md ("The spec JSON"); script_name is the script's name
        inside the uploaded payload dir (defaults to payload.script). A section or limit the job does not use
        stays out, so that its wire form, and the spec hash the history keeps of it, is what it was without it."""
        wire = {"name": self.name, "job_id": check_job_id(job_id), **self._wire_services(),
                "gpu": {"devices": [str(d) for d in self.gpu.devices], "required_mib": int(required_mib),
                        "drain_timeout": self.gpu.drain_timeout},
                "payload": self._wire_payload(script_name), "limits": self.limits.model_dump()}
        if self.launcher == "slurm":
            wire.update(launcher="slurm", slurm=wire_slurm(self))
        if wire["limits"]["max_downtime"] is None:
            del wire["limits"]["max_downtime"]
        if not self.payload.staged:
            del wire["limits"]["stage_timeout"]
        if self.sweep is not None:  # expanded here: the host runs the variants as given
            wire["sweep"] = {"fail_fast": self.sweep.fail_fast,
                             "variants": [{"args": v, "argv": self._variant_argv(v)} for v in self.sweep.variants()]}
            if self.launcher == "slurm":  # one job array: `%max_parallel`, every variant when not given
                wire["sweep"]["max_parallel"] = self.sweep.max_parallel or len(wire["sweep"]["variants"])
            if self.sweep.gpus_per_variant is not None:
                wire["sweep"]["gpus_per_variant"] = self.sweep.gpus_per_variant
        return wire

    def _variant_argv(self, variant: dict) -> list[str]:
        """A script's args with the variant's over them, or the command with its `{KEY}`s filled."""
        if self.payload.command is not None:
            return sweeps.fill(self.payload.command, variant)
        return self.payload_args({**self.payload.args, **variant})

    def _wire_services(self) -> dict:
        """`services` as listed, or the one `service`; the host picks those the job's GPUs meet."""
        if self.services is not None:
            return {"services": [s.wire() for s in self.services]}
        if self.service.manager == "none":
            return {"service": {"manager": "none"}}
        return {"service": self.service.wire()}

    def _wire_payload(self, script_name: str | None) -> dict:
        payload = self.payload
        script = (script_name or payload.script) if payload.script is not None else None
        return {"python": payload.python, "script": script, "args": self.payload_args(),
                "command": list(payload.command) if payload.command is not None else None, "env": dict(payload.env),
                "prepare": self.prepare_argv(), **({"staged": True} if payload.staged else {}),
                **({"user": payload.user} if payload.user is not None else {})}

    def prepare_args_merged(self) -> dict | None:
        """The prepare run's args: `args` with `prepare_args` over them (None without a prepare step)."""
        if self.payload.prepare_args is None:
            return None
        return {**self.payload.args, **self.payload.prepare_args}

    def prepare_argv(self) -> list[str] | None:
        """On the wire: the script's argv tail for the prepare run, or the prepare command; None = no step."""
        if self.payload.prepare_command is not None:
            return list(self.payload.prepare_command)
        merged = self.prepare_args_merged()
        return None if merged is None else self.payload_args(merged)


# -- the rules between `launcher`, `slurm`, a host list and the other sections; the wire's `slurm` ------------

def launcher_problem(spec: JobSpec) -> str | None:
    """The rules between `launcher`, `slurm` and the other sections; None when they hold."""
    if spec.launcher == "ssh":
        return "a `slurm` section needs `launcher: slurm`" if spec.slurm is not None else None
    if spec.service.manager != "none":
        return ("launcher slurm needs service.manager: none: the scheduler owns the GPUs, so there is no "
                "service of ours to stop and restore on the node it picks")
    if spec.gpu.devices:
        return ("launcher slurm picks no gpu.devices: Slurm hands out the GPUs (ask with slurm.gres or "
                "slurm.gpus; the job sees them in CUDA_VISIBLE_DEVICES)")
    if spec.limits.max_downtime is not None:
        return MAX_DOWNTIME_ON_SLURM
    if spec.slurm is not None and spec.slurm.time is not None:
        return time_problem(minutes(spec.slurm.time), spec.limits.max_runtime, spec.limits.grace, setup_s(spec))
    return None


def fleet_problem(spec: JobSpec) -> str | None:
    """The rules between a host list, `rollout` and the launcher; None when they hold."""
    fleet = isinstance(spec.host.address, list)
    if spec.rollout is not None and not fleet:
        return "a `rollout` section goes with a list of hosts in host.address"
    if fleet and spec.launcher != "ssh":
        return "a list of hosts in host.address goes with `launcher: ssh` (Slurm places jobs itself)"
    return None


def setup_s(spec: JobSpec) -> float:
    """What the allocation runs before the payload, at its bounds (the prepare step, the staging)."""
    return setup_seconds(spec.limits.model_dump(), {"prepare": spec.prepare_argv(), "staged": spec.payload.staged})


def wire_slurm(spec: JobSpec) -> dict:
    """The wire form's `slurm` section: the user's choices, `time` replaced by `time_min` (whole minutes)."""
    slurm = (spec.slurm or SlurmSpec()).model_dump()
    seconds = slurm.pop("time")
    slurm["time_min"] = (minutes(seconds) if seconds is not None
                         else time_limit_minutes(spec.limits.max_runtime, spec.limits.grace, setup_s(spec)))
    return slurm
