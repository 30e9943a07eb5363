"""The one contract both sides of runner share: names, limits, defaults, states and the wire codes.

Stdlib only, no I/O. The controller's pydantic validators and the host's checks both use it, so a rule cannot
drift between the two sides (tests/unit/test_contract_controller.py, tests/integration/test_contract_host.py).
Each `*_problem(value)` returns None when the value is acceptable, else a message that says what is allowed.
"""
from __future__ import annotations

import re

TYPE_CHECKING = False  # typing is not imported at run time: every host call (`status`, `logs`) would pay for it
if TYPE_CHECKING:
    from typing import Any, Literal

PROTOCOL = 1  # bump when an answer's shape changes incompatibly

# ── job states, ordered; the last five are terminal ─────────────────────────────────────────────────────
STATES = ("QUEUED", "PREPARING", "STOPPING_SERVICE", "DRAINING", "RUNNING", "TERMINATING", "RESTORING",
          "SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "LOST")
TERMINAL = frozenset(("SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "LOST"))
# systemd ActiveStates in which a service is (or is becoming) up: stopping it means restoring it later.
RUNNING_SERVICE_STATES = frozenset(("active", "activating", "reloading"))


def is_terminal(state: str) -> bool:
    return state in TERMINAL


# ── defaults (the spec's and the host's are the same numbers) ──────────────────────────────────────────
DEFAULTS: dict[str, Any] = {  # values of several types: read by literal key and by computed key
    "limits.max_runtime": 3600.0,
    "limits.grace": 30.0,
    "limits.queue_timeout": 7200.0,    # --queue: the longest wait for the locks (a default holder: 1 h run + stop/drain/restore)
    "limits.prepare_timeout": 1800.0,  # a cold JIT compile before the stop
    "limits.stage_timeout": 600.0,     # a staged payload's GPU-free setup before the service is touched
    "limits.max_downtime": None,       # the window: every job ends by it; a variant starts only if it may fit
    "gpu.drain_timeout": 120.0,
    "gpu.required_mib": 0,
    "service.manager": "none",
    "service.scope": "system",
    "service.stop": "if-needed",
    "service.health_timeout": 900.0,
    "service.sudo": False,
    "service.gpus": (),                # the GPUs the service holds: none listed = every GPU of the host
    "payload.python": "python3",
    "host.root": "~/.runner",
}
FREE_METHODS = ("stop", "sglang", "vllm")  # service.free; stop: systemctl stop / start
PAUSE_MODES = ("drain", "abort", "retract")  # service.pause_mode; None = the release's own (retract, else drain)
DRAIN_FALLBACKS = ("skip", "abort")  # service.drain_fallback, past drain_timeout; None = skip (abort nothing)
MAX_DRAIN_TIMEOUT_S = 300.0  # the release's own bound (supervision/budget.py STOP_TIMEOUT_S) must hold it


def origin(url: str) -> str:
    """scheme://host[:port] of a URL: where an engine's routes are when only its health URL is given."""
    scheme, _, rest = url.partition("://")
    return "%s://%s" % (scheme, rest.split("/", 1)[0]) if rest else ""


# service.api_key / admin_api_key: where the engine's key lives on the host, never the key itself (a refusal never
# echoes the value: it may be a key put there by mistake).
KEY_FIELDS = ("api_key", "admin_api_key")
KEY_REF_RE = re.compile(r"file:/[^\x00-\x1f]+|env:[A-Za-z_][A-Za-z0-9_]*")


def key_ref_problem(field: str, value) -> str | None:
    if value is None or (isinstance(value, str) and KEY_REF_RE.fullmatch(value)):
        return None
    return ("service.%s names where the engine's key lives on the host: file:/ABSOLUTE/PATH (readable by the host "
            "login) or env:NAME (a variable of the unit's Environment= or EnvironmentFile=); never the key itself "
            "(the value given is not shown)" % field)


# Each set of choices is a tuple and a Literal of the same values (the pydantic models' field type), made on
# first use (`__getattr__` below) so that a host call never imports typing.
SERVICE_MANAGERS = ("systemd", "none")
LAUNCHERS = ("ssh", "slurm")  # ssh: the supervisor runs the payload on the host; slurm: sbatch places it
SERVICE_SCOPES = ("system", "user")
USER_SCOPE_SUDO = ("scope: user with sudo: true would manage root's user manager, not the login's: "
                   "use scope: user without sudo, or scope: system with sudo")
STOP_POLICIES = ("always", "if-needed", "never")
if TYPE_CHECKING:
    ServiceManager = Literal["systemd", "none"]
    Launcher = Literal["ssh", "slurm"]
    ServiceScope = Literal["system", "user"]
    StopPolicy = Literal["always", "if-needed", "never"]
else:
    LITERALS = {"ServiceManager": SERVICE_MANAGERS, "Launcher": LAUNCHERS, "ServiceScope": SERVICE_SCOPES,
                "StopPolicy": STOP_POLICIES}

    def __getattr__(name: str):
        """ServiceManager, Launcher, ServiceScope, StopPolicy: the Literal of its tuple, made once."""
        if name not in LITERALS:
            raise AttributeError("module %r has no attribute %r" % (__name__, name))
        from typing import Literal

        made = globals()[name] = Literal[LITERALS[name]]
        return made

# ── the wire: exit status of BOOT and the `error` codes of `{"ok": false, …}` answers ───────────────────
MAX_RESULT_BYTES = 32 << 20  # the largest result.json `result` answers with (and the controller renders)
MAX_RESULT_DEPTH = 56  # the deepest nesting a result may have: inside a sweep's record and an answer it stays
#                        within the controller's 64 levels (runner/remote/answers.py)
EXIT_PAYLOAD_MISSING = 42  # BOOT found no supervisor for this payload hash: upload, then call again
ERRORS = {
    "payload-missing": "the payload bundle is not on the host (upload it, then repeat the call)",
    "bad-bundle": "the uploaded bundle was unsafe or did not hash to its name",
    "upload-failed": "the bundle could not be written under host.root (disk full, read-only): nothing left behind",
    "upload-cut": "the upload ended before a bundle was whole: the files that came whole are kept for the next one",
    "bad-args": "the call's arguments are invalid (job id, offsets, options)",
    "bad-spec": "the spec JSON breaks a rule of this contract",
    "bad-offset": "a log offset outside the file",
    "bad-status": "status.json exists but cannot be read: an error, never 'running'",
    "busy": "a lock is held by another job (the answer names the holder)",
    "preflight-refused": "submit's admission refused the job (memory, stop policy, GPU, engine), or the service cannot "
                         "be the one meant (no such unit, a health URL that does not answer): nothing was touched",
    "exists": "a job with this id was already claimed on the host",
    "unknown-job": "no job with this id on the host",
    "no-result": "the job wrote no result.json",
    "result-too-large": "result.json is over MAX_RESULT_BYTES (or not a regular file of the job dir); the answer names its path",
    "drain-timeout": "the GPU memory did not become free in time",
    "start-failed": "the detached supervisor did not report ready",
    "cannot-start": "the payload could not start (interpreter, script, program, cache dir): nothing was touched",
    "sudo-password": "sudo asked for a password (a NOPASSWD rule is needed)",
    "no-systemd": "systemctl cannot reach a service manager of this scope: the host's services are not run by systemd",
    "timeout": "a host command did not finish in time",
    "unsafe-root": "host.root, the payload dir or the host lock place (/run/lock) is writable by others or not owned "
                   "by the login user (or root)",
    "slurm-refused": "sbatch refused the job (the message is sbatch's own); nothing was queued",
    "slurm-unavailable": "sbatch/squeue are missing on the login node, or slurmctld does not answer",
    "newer-protocol": "a record (status.json) was written by a newer runner's supervisor: use that runner",
    "internal": "anything else; the message says what",
}

# ── the wire: the verbs `supervisor.py VERB … --root ROOT` answers (docs/protocol.md's table is made from this) ──
# verb: (its arguments besides --root, what it reads on stdin, what it does). A verb starting with `_` is the
# supervisor's own (its detached run, its guard) and never called by the controller.
VERBS = {
    "preflight": ("[--job-id ID]", "spec JSON", "what the host has for this job: GPUs, their apps, the service, locks, "
                  "the interpreter, whether the payload may start"),
    "submit": ("[--job-id ID] [--queue]", "spec JSON", "preflight, the admission verdict and the start in one call "
               "(without --job-id, the spec's own job_id: a call opened before the spec was checked)"),
    "start": ("--job-id ID [--queue]", "spec JSON", "claim the job dir and start the detached supervisor"),
    "status": ("[--job-id ID …] [--ids-on-stdin] [--wait S]", "a JSON list of ids (--ids-on-stdin)", "the jobs' "
               "status.json (all jobs without ids), LOST marked and restored; with --wait, once one of the named "
               "jobs changed state or ended, or S passed"),
    "logs": ("--job-id ID --offset N [--max B] [--wait S] [--stream [--follow]]", "-", "output.log's bytes from N, "
             "waiting up to S seconds for more; --stream: in frames for the whole wait (--follow: until the job "
             "ended)"),
    "cancel": ("--job-id ID", "-", "ask the supervisor to stop the payload; it then restores"),
    "restore": ("--job-id ID", "-", "settle a job whose supervisor and guard are gone: the service back"),
    "restore-service": ("--unit U [--scope system/user] [--sudo] [--health-url URL] [--max-wait S]", "-",
                        "start the unit if inactive, wait for healthy"),
    "result": ("--job-id ID", "-", "the job's result.json, bounded, and the windows of the services it freed"),
    "gc": ("[--keep-jobs N] [--keep-days D] [--dry-run] [--ids-on-stdin]", "a JSON list of ids (--ids-on-stdin)",
           "the retention rule: old ended job dirs and unused bundles deleted (with --ids-on-stdin only those "
           "jobs', the others named)"),
    "slurm-run": ("--job-id ID", "-", "what a Slurm batch script execs in its allocation"),
}

# ── names and paths ─────────────────────────────────────────────────────────────────────────────────────
JOB_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
UNIT_RE = re.compile(r"[A-Za-z0-9:_.\\-]+(?:@[A-Za-z0-9:_.\\-]+)?")
UNIT_MAX = 240  # systemd's limit is 255 with the suffix we may add
# systemctl appends .service to a name without one of these suffixes; both sides do the same, visibly.
UNIT_SUFFIXES = (".service", ".socket", ".device", ".mount", ".automount", ".swap", ".target", ".path",
                 ".timer", ".slice", ".scope")
ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PAYLOAD_USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
GPU_UUID_RE = re.compile(r"GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
GPU_INDEX_RE = re.compile(r"[0-9]{1,4}")


def job_id_problem(value) -> str | None:
    """1-128 of [A-Za-z0-9._-]; not '.', '..', nor starting with '-' (it would read as an option)."""
    if (not isinstance(value, str) or not JOB_ID_RE.fullmatch(value) or value in (".", "..")
            or value.startswith("-")):
        return "a job id is 1-128 of [A-Za-z0-9._-], not '.' or '..' and not starting with '-'; got %s" % _short(value)
    return None


def unit_problem(value) -> str | None:
    """systemd's unit-name characters, at most one '@'; no '..', not starting with '-', '.' or '@'."""
    if (not isinstance(value, str) or not UNIT_RE.fullmatch(value) or ".." in value
            or value.startswith(("-", ".", "@")) or len(value) > UNIT_MAX):
        return ("a unit is a systemd unit name (letters, digits, `:_.\\-`, one `@`; no `..`, not starting with "
                "`-`, `.` or `@`, at most %d characters); got %s" % (UNIT_MAX, _short(value)))
    return None


def normalize_unit(value: str) -> str:
    """What systemctl would do: a name without a known suffix means NAME.service. Call after unit_problem."""
    return value if value.endswith(UNIT_SUFFIXES) else value + ".service"


def script_problem(value) -> str | None:
    """A payload script is a relative path inside the uploaded payload dir: no '/', '.', '..' or empty part."""
    if (not isinstance(value, str) or not value or "\0" in value or value.startswith("/")
            or any(part in ("", ".", "..") for part in value.split("/"))):
        return ("script must be a relative file path at or below the job file's directory (no `..`, `.` or empty "
                "parts: it names a file of the uploaded payload dir); got %s" % _short(value))
    return None


def env_key_problem(value) -> str | None:
    if not isinstance(value, str) or not ENV_KEY_RE.fullmatch(value):
        return "environment variable names must match [A-Za-z_][A-Za-z0-9_]*; got %s" % _short(value)
    if value.startswith("RUNNER_"):
        return "RUNNER_* variables are set by the supervisor and cannot be overridden; got %s" % _short(value)
    return None


def payload_user_problem(value) -> str | None:
    """payload.user: a portable login name ([a-z_][a-z0-9_-]*, at most 32), never root (the point is a user
    the payload is not)."""
    if not isinstance(value, str) or not PAYLOAD_USER_RE.fullmatch(value) or value == "root":
        return "payload.user is an unprivileged login name ([a-z_][a-z0-9_-]*, at most 32; not root); got %s" % (
            _short(value))
    return None


def device_problem(value) -> str | None:
    """A GPU by index (0, 1, …) or by UUID; on the wire both are text."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else value
    if isinstance(text, str) and (GPU_INDEX_RE.fullmatch(text) or GPU_UUID_RE.fullmatch(text)):
        return None
    return ("a device is a GPU index (0, 1, …) or a UUID like GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx; got %s"
            % _short(value))


def gpus_meet(job_gpus, service_gpus) -> bool:
    """Whether a job on `job_gpus` needs a service on `service_gpus` freed: an empty list is every GPU, so it
    meets anything; else they share a card. Both lists name cards alike (indices as text, or UUIDs)."""
    return not job_gpus or not service_gpus or bool(set(map(str, job_gpus)) & set(map(str, service_gpus)))


def services_of(spec: dict) -> list:
    """The systemd services a normalised wire spec frees, in order: `services` when the host side listed them
    (several, or some of the host's left serving), else the one `service` (none for `manager: none`)."""
    if "services" in spec:
        return list(spec["services"])
    return [spec["service"]] if spec["service"].get("manager") == "systemd" else []


def root_problem(value) -> str | None:
    """host.root: absolute or under ~; no '$' or '%' (systemd-run expands both in the guard's command)."""
    if not isinstance(value, str) or not (value == "~" or value.startswith(("~/", "/"))) or "\0" in value:
        return "root must be an absolute path or start with ~/; got %s" % _short(value)
    if "$" in value or "%" in value:
        return "root must not contain '$' or '%%'; got %s" % _short(value)
    return None


# ── may the payload start: the environment keys that name a JIT cache directory ──────────────────────
# A compile that cannot write its cache fails inside the downtime window; these must be writable or creatable.
CACHE_DIR_SUFFIX = "_CACHE_DIR"  # TRITON_, TVM_FFI_, TORCHINDUCTOR_, SGLANG_JIT_, FLASHINFER_WORKSPACE_ …
CACHE_DIR_KEYS = frozenset(("CUDA_CACHE_PATH", "TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME", "TRITON_HOME",
                            "HF_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TVM_FFI_CACHE_DIR"))
START_PROBE_TIMEOUT_S = 5.0  # how long payload.python may take to answer the host's `python -c` probe


def cache_dir_keys(env: dict) -> list:
    """The keys of payload.env whose value is a cache directory the payload will write (sorted)."""
    return sorted(k for k in env if k.endswith(CACHE_DIR_SUFFIX) or k in CACHE_DIR_KEYS)


# ── GPU memory: one rule for "is it short" ──────────────────────────────────────────────────────────────
def memory_verdict(gpu: dict, required_mib: int) -> str:
    """'too-small' when the card's total is below the need (no stop can help), 'short' when free memory is
    below it or unknown, else 'ok'. gpu has total_mib and free_mib (None when nvidia-smi could not say)."""
    total, free = gpu.get("total_mib"), gpu.get("free_mib")
    if total is not None and required_mib > total:
        return "too-small"
    if free is None or free < required_mib:
        return "short"
    return "ok"


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
