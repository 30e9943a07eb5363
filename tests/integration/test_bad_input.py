"""Bad input through the real CLI: every case exits 2 with a message naming the field, and reaches no host.

The proof that nothing ran remotely: the spec's host is the loopback test sshd's alias, reached through an
ssh_config whose ProxyCommand (tests/hosts/recording.py) logs every connection attempt before relaying
it. Each case has its own log; it must stay empty. The positive control sends a valid spec the same way and
its log must show the connection (and the job must run), so an empty log is not an accident of a broken
proxy. Pydantic-level and property tests of the loader are in test_spec.py; these go through the CLI.

The ~90 CLI processes run a few at a time in one module fixture (each is a Python start-up, ~0.5 s), once per
test run however many xdist workers draw these tests.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.cli_helpers import REPO
from tests.hosts._proc import shared_tmpdir
from tests.hosts.recording import connection_attempts, recording_ssh_config
from tests.reliability_report import record_bad_input

DELETE = object()


@dataclass(frozen=True)
class Case:
    name: str
    field: str  # what the message must name
    changes: dict | None = None  # dotted path -> value (DELETE removes) applied to a valid spec
    text: bytes | None = None  # the whole spec file instead
    argv: tuple[str, ...] = ()  # CLI arguments; "{spec}" is a valid spec, "{this}" this case's spec

    def spec_document(self, base: dict) -> dict:
        document = json.loads(json.dumps(base))
        for path, value in (self.changes or {}).items():
            *parents, last = path.split(".")
            section = document
            for key in parents:
                section = section.setdefault(key, {})
            if value is DELETE:
                section.pop(last, None)
            else:
                section[last] = value
        return document


SYSTEMD = {"service.manager": "systemd", "service.unit": "dummy-infer.service"}
SCRIPT = {"payload.command": DELETE, "payload.script": "demo_payload.py"}

SPEC_CASES = [
    Case("unknown top-level key", "nmae", {"nmae": "typo"}),
    Case("unknown key in host", "host.adress", {"host.adress": "ct200"}),
    Case("unknown key in payload", "payload.scirpt", {"payload.scirpt": "x.py"}),
    Case("unknown key in service", "service.stpo", {"service.stpo": "always"}),
    Case("missing name", "name", {"name": DELETE}),
    Case("missing payload", "payload", {"payload": DELETE}),
    Case("name is a list", "name", {"name": [1, 2]}),
    Case("name with a newline", "name", {"name": "two\nlines"}),
    Case("port as text", "host.port", {"host.port": "22"}),
    Case("port out of range", "host.port", {"host.port": 70000}),
    Case("port is a boolean", "host.port", {"host.port": True}),
    Case("address with ;", "host.address", {"host.address": "ct200; reboot"}),
    Case("address with $( )", "host.address", {"host.address": "$(id)"}),
    Case("user with $( )", "host.user", {"host.user": "root$(id)"}),
    Case("relative host root", "host.root", {"host.root": "relative/dir"}),
    Case("host root with newline", "host.root", {"host.root": "/tmp/x\ny"}),
    Case("host key policy auto-add", "host.host_key_policy", {"host.host_key_policy": "auto-add"}),
    Case("host python with ;", "host.python", {"host.python": "python3; id"}),
    Case("negative max_runtime", "limits.max_runtime", {"limits.max_runtime": -5}),
    Case("zero max_runtime", "limits.max_runtime", {"limits.max_runtime": 0}),
    Case("max_runtime in years", "limits.max_runtime", {"limits.max_runtime": "10y"}),
    Case("absurd max_runtime", "limits.max_runtime", {"limits.max_runtime": 10 ** 12}),
    Case("grace NaN", "limits.grace", {"limits.grace": float("nan")}),
    Case("negative grace text", "limits.grace", {"limits.grace": "-1s"}),
    Case("drain_timeout forever", "gpu.drain_timeout", {"gpu.drain_timeout": "forever"}),
    Case("huge health_timeout", "service.health_timeout", {**SYSTEMD, "service.health_timeout": 1e30}),
    Case("unit with ;", "service.unit", {**SYSTEMD, "service.unit": "sglang; rm -rf /"}),
    Case("unit with ..", "service.unit", {**SYSTEMD, "service.unit": "../../etc/evil.service"}),
    Case("unit with $( )", "service.unit", {**SYSTEMD, "service.unit": "$(reboot).service"}),
    Case("unit that is an option", "service.unit", {**SYSTEMD, "service.unit": "--force"}),
    Case("health_url not http", "service.health_url", {**SYSTEMD, "service.health_url": "file:///etc/passwd"}),
    Case("systemd without unit", "service", {"service.manager": "systemd"}),
    Case("stop policy unknown", "service.stop", {**SYSTEMD, "service.stop": "sometimes"}),
    Case("script with ..", "payload.script", {**SCRIPT, "payload.script": "../../etc/passwd"}),
    Case("absolute script", "payload.script", {**SCRIPT, "payload.script": "/etc/passwd"}),
    Case("payload python with ;", "payload.python", {"payload.python": "python3; id"}),
    Case("payload python with ..", "payload.python", {"payload.python": "../bin/python"}),
    Case("env key with -", "payload.env", {"payload.env": {"BAD-KEY": "1"}}),
    Case("env key starting with a digit", "payload.env", {"payload.env": {"1ABC": "1"}}),
    Case("env key RUNNER_*", "payload.env", {"payload.env": {"RUNNER_JOB_ID": "forged"}}),
    Case("env key with a space", "payload.env", {"payload.env": {"A B": "1"}}),
    Case("env value a mapping", "payload.env.X", {"payload.env": {"X": {"nested": 1}}}),
    Case("arg name with ;", "payload.args", {**SCRIPT, "payload.args": {"a;b": 1}}),
    Case("script and command", "payload", {"payload.script": "demo_payload.py"}),
    Case("empty command", "payload", {"payload.command": []}),
    Case("negative GPU index", "gpu.devices", {"gpu.devices": [-1]}),
    Case("GPU listed twice", "gpu.devices", {"gpu.devices": [0, 0]}),
    Case("GPU uuid with ..", "gpu.devices", {"gpu.devices": ["GPU-../x"]}),
    Case("negative min_free_mib", "gpu.min_free_mib", {"gpu.min_free_mib": -5}),
]

TEXT_CASES = [
    Case("YAML syntax error", "job.yaml:2:1", text=b"name: [unclosed\n"),
    Case("tab indentation", "job.yaml:2:", text=b"name: x\n\thost: {address: a}\n"),
    Case("top level is a list", "top level", text=b"- name\n- host\n"),
    Case("empty file", "top level", text=b""),
    Case("duplicate key", "duplicate key 'name'", text=b"name: a\nname: b\n"),
    Case("not UTF-8", "not UTF-8", text=b"name: caf\xe9\n"),
    Case("python object tag", "job.yaml:1:", text=b"name: !!python/object/apply:os.system ['id']\n"),
    Case("huge file", "larger than", text=b"name: x\n" + b"#" * (1 << 20) + b"\n"),
]

CLI_CASES = [
    Case("no such spec file", "no such file", argv=("submit", "/nonexistent/job.yaml")),
    Case("spec path is a directory", "is a directory", argv=("submit", "/tmp")),
    Case("--job-id with ..", "job id", argv=("submit", "{spec}", "--job-id", "../x")),
    Case("--job-id with /", "job id", argv=("submit", "{spec}", "--job-id", "a/b")),
    Case("--job-id ..", "job id", argv=("submit", "{spec}", "--job-id", "..")),
    Case("--job-id like an option", "job id", argv=("submit", "{spec}", "--job-id=-rf")),
    Case("--job-id with a space", "job id", argv=("submit", "{spec}", "--job-id", "x y")),
    Case("--job-id empty", "job id", argv=("submit", "{spec}", "--job-id", "")),
    Case("tail id with ..", "job id", argv=("tail", "../../etc")),
    Case("status id with /", "job id", argv=("status", "a/b")),
    Case("cancel id ..", "job id", argv=("cancel", "..")),
    Case("results id with ;", "job id", argv=("results", "x;y")),
    Case("tail unknown id", "unknown job id", argv=("tail", "no-such-job", "-f")),
    Case("status unknown id", "unknown job id", argv=("status", "no-such-job")),
    Case("cancel unknown id", "unknown job id", argv=("cancel", "no-such-job")),
    Case("results unknown id", "unknown job id", argv=("results", "no-such-job")),
    Case("--set without =", "--set", argv=("submit", "{spec}", "--set", "noequals")),
    Case("--set negative duration", "limits.max_runtime", argv=("submit", "{spec}", "--set", "limits.max_runtime=-1")),
    Case("--set through a scalar", "name is not a mapping", argv=("submit", "{spec}", "--set", "name.x=1")),
    Case("--set bad env key", "payload.env", argv=("submit", "{spec}", "--set", "payload.env.BAD-KEY=1")),
    Case("--set invalid YAML", "--set", argv=("submit", "{spec}", "--set", "payload.command=[unclosed")),
    Case("--set port as text", "host.port", argv=("submit", "{spec}", "--set", "host.port=abc")),
    Case("--set unknown key", "payload.scirpt", argv=("submit", "{spec}", "--set", "payload.scirpt=x.py")),
    Case("--max-wait negative", "--max-wait", argv=("tail", "some-job", "--max-wait", "-1")),
    Case("--max-wait not a number", "--max-wait", argv=("tail", "some-job", "--max-wait", "abc")),
    Case("--max-wait absurd", "--max-wait", argv=("tail", "some-job", "-f", "--max-wait", "99999")),
    Case("unknown option on submit", "--bogus", argv=("submit", "{spec}", "--bogus")),
    Case("unknown option on status", "--nope", argv=("status", "--nope")),
    Case("unknown command", "deploy", argv=("deploy", "{spec}")),
    Case("restore-service without --unit", "--unit", argv=("restore-service", "--host", "testhost")),
    Case("restore-service host with ;", "--host", argv=("restore-service", "--host", "a;b", "--unit", "x")),
    Case("restore-service unit with ;", "unit", argv=("restore-service", "--host", "testhost", "--unit", "x;y")),
    Case("restore-service --max-wait negative", "--max-wait",
         argv=("restore-service", "--host", "testhost", "--unit", "x", "--max-wait", "-3")),
    Case("restore-service health URL not http", "health_url",
         argv=("restore-service", "--host", "testhost", "--unit", "x", "--health-url", "ftp://x/")),
    Case("restore-service --set without a job file", "--set",
         argv=("restore-service", "--host", "testhost", "--unit", "x", "--set", "service.sudo=true")),
    Case("restore-service bad spec", "service.unit", argv=("restore-service", "{this}"),
         changes={**SYSTEMD, "service.unit": "a b"}),
    Case("--set empty value", "payload.args.seconds=null", argv=("submit", "{spec}", "--set", "payload.args.seconds=")),
    Case("min_free_mib past 16 TiB", "gpu.min_free_mib", {"gpu.min_free_mib": 99999999999999999999}),
    Case("a range error is a runner error line", "runner: error: Invalid value for '--max-wait'",
         argv=("tail", "some-job", "-f", "--max-wait", "99999")),
    Case("YAML alias bomb", "expands to more than",
         text=b"name: b\ngpu: {min_free_mib: [&a [x,x,x,x,x,x,x,x,x], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a], "
              b"&c [*b,*b,*b,*b,*b,*b,*b,*b,*b], &d [*c,*c,*c,*c,*c,*c,*c,*c,*c], &e [*d,*d,*d,*d,*d,*d,*d,*d,*d], "
              b"&f [*e,*e,*e,*e,*e,*e,*e,*e,*e], &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]]}\n"),
    Case("a secrets file", "not a job spec", text=b"DB_PASSWORD: hunter2\nAPI_TOKEN: ghp_0123456789\n"),
]

CASES = SPEC_CASES + TEXT_CASES + CLI_CASES


@dataclass
class Outcome:
    done: subprocess.CompletedProcess
    connections: list[str]

    def to_json(self) -> dict:
        return {"args": [str(word) for word in self.done.args], "returncode": self.done.returncode,
                "stdout": self.done.stdout.hex(), "stderr": self.done.stderr.hex(), "connections": self.connections}

    @classmethod
    def from_json(cls, value: dict) -> Outcome:
        done = subprocess.CompletedProcess(value["args"], value["returncode"], bytes.fromhex(value["stdout"]),
                                           bytes.fromhex(value["stderr"]))
        return cls(done, value["connections"])


def base_spec(alias: str, root: Path) -> dict:
    return {"name": "bad input probe", "host": {"address": alias, "root": str(root)},
            "service": {"manager": "none"}, "payload": {"command": ["true"]},
            "limits": {"max_runtime": "1m", "grace": "2s"}}


def write_spec(path: Path, document: dict) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))
    return path


def run_recorded(argv: list[str], workdir: Path, ssh_host) -> Outcome:
    """The CLI with its own state dir and a recording ssh_config whose log is this run's alone."""
    log = workdir / "connections.log"
    config = recording_ssh_config(ssh_host.ssh_config, log, workdir / "ssh_config")
    env = {**os.environ, "RUNNER_SSH_CONFIG": str(config), "RUNNER_STATE_DIR": str(workdir / "state")}
    done = subprocess.run([sys.executable, "-m", "runner", *argv], capture_output=True, timeout=120, env=env,
                          cwd=REPO)
    return Outcome(done, connection_attempts(log))


def case_argv(case: Case, casedir: Path, valid_spec: Path, base: dict) -> list[str]:
    this = casedir / "job.yaml"
    if case.text is not None:
        this.write_bytes(case.text)
    elif case.changes is not None:
        write_spec(this, case.spec_document(base))
    if not case.argv:
        return ["submit", str(this)]
    return [word.replace("{spec}", str(valid_spec)).replace("{this}", str(this)) for word in case.argv]


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory):
    """Every case's CLI run once per test run, four at a time; name -> Outcome. The first pytest-xdist worker
    to get here runs them and leaves the outcomes in the run's shared temp dir; the others wait for that file
    and read it (each worker that drew one of these tests ran all ~90 CLI processes again: six times, ~0.2 s
    of CPU each, on a CPU-bound suite)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # every worker's basetemp is a dir of this run's
    path = shared / "bad-input-outcomes.json"
    with open(shared / "bad-input-outcomes.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel if its holder dies: the next one runs them
        if not path.exists():
            ran = run_every_case(request.getfixturevalue("ssh_host"))
            path.write_text(json.dumps({name: outcome.to_json() for name, outcome in ran.items()}))
    return {name: Outcome.from_json(value) for name, value in json.loads(path.read_text()).items()}


def run_every_case(ssh_host) -> dict[str, Outcome]:
    work = shared_tmpdir("runner-badinput-")
    base = base_spec(ssh_host.alias, work / "root")
    valid = write_spec(work / "valid.yaml", base)

    def run(index_case):
        index, case = index_case
        casedir = work / f"case-{index:03d}"
        casedir.mkdir()
        return case.name, run_recorded(case_argv(case, casedir, valid, base), casedir, ssh_host)

    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            return dict(pool.map(run, enumerate(CASES)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_case_names_are_unique():
    assert len({case.name for case in CASES}) == len(CASES) >= 40


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_input_exits_2_naming_the_field_and_reaches_no_host(case, outcomes):
    outcome = outcomes[case.name]
    stderr = outcome.done.stderr.decode("utf-8", "replace")
    named = case.field in stderr
    record_bad_input(case.name, outcome.done.returncode, named, len(outcome.connections), stderr)
    assert outcome.done.returncode == 2, stderr
    assert named, f"message does not name {case.field!r}: {stderr}"
    assert "Traceback" not in stderr
    assert outcome.connections == [], "the controller connected to the host"


def test_positive_control_a_valid_submit_is_recorded(ssh_host):
    """Same proxy, same host, a valid spec: the connection shows up in the log and the job runs."""
    work = shared_tmpdir("runner-badinput-control-")
    spec = write_spec(work / "valid.yaml", base_spec(ssh_host.alias, work / "root"))
    outcome = run_recorded(["submit", str(spec), "--job-id", "control.1", "--json"], work, ssh_host)
    assert outcome.done.returncode == 0, outcome.done.stderr.decode()
    assert len(outcome.connections) >= 1
    job_dir = work / "root" / "jobs" / "control.1"
    try:
        assert (job_dir / "status.json").exists()  # the root is a shared dir: the host wrote it here
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- help and usage texts (no host involved) ----------------------------------------------------------------

def runner_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner", *argv], capture_output=True, timeout=60, cwd=REPO)


def test_help_says_exit_4_as_the_readme_does():
    row = next(line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("| 4 | "))
    readme = "4 " + row[len("| 4 | "):].rstrip(" |")
    assert readme in " ".join(runner_cli("--help").stdout.decode().split())


@pytest.mark.parametrize("argv", [("tail", "j", "--max-wait", "99999"), ("status", "--nope"), ("deploy",)])
def test_usage_errors_are_runner_error_lines(argv):
    done = runner_cli(*argv)
    stderr = done.stderr.decode()
    assert done.returncode == 2 and stderr.startswith("runner: error: "), stderr
    assert "Usage:" not in stderr and "\nError:" not in stderr and "--help" in stderr


def test_durations_are_named_in_help():
    assert "--timeout DURATION" in runner_cli("wait", "--help").stdout.decode()
