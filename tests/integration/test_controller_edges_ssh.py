"""The controller's edges over a real loopback sshd (both SSH transports): a host's answer is not read past its
cap (peak memory stays small), a refused login is `auth-failed` and never tried again, `status` of every job
exits 3 (not 75) for a changed host key, a GPU refusal lists every GPU of the host, and every command's
--max-wait reaches its host calls (a test walks the code below the front ends for a host call without it).
"""
from __future__ import annotations

import ast
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.state.fleet_store import STARTED, HostEntry, RunRecord, RunStore
from runner.state.store import JobRecord, Store
from tests.cli_helpers import REPO, Target, local_target, run_cli, write_job
from tests.harness.pace import Scale
from tests.hosts._proc import shared_tmpdir
from tests.hosts.sshd import generate_key

MIB = 1 << 20
# A process holding a 256 MiB answer (plus its decoded copies) peaks far above this; one that stops reading at
# the 32 MiB cap stays well under it.
RSS_BOUND_MIB = 200


@pytest.fixture(params=["openssh", "paramiko"])
def transport(request) -> str:
    return request.param


def ssh_target(ssh_host, transport: str, config: Path | None = None, **host) -> Target:
    root = shared_tmpdir("runner-root-edges-")
    return Target("ssh", {"address": ssh_host.alias, "root": str(root), "transport": transport, **host}, root,
                  {"RUNNER_SSH_CONFIG": str(config or ssh_host.ssh_config)}, ssh_host)


def peak_rss(target: Target, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """`runner ARGS` and its peak resident memory in MiB (the largest of it and its children: ssh)."""
    measure = ("import json, resource, subprocess, sys\n"
               "done = subprocess.run(sys.argv[1:], capture_output=True)\n"
               "print(json.dumps([done.returncode, done.stdout.decode(errors='replace'), "
               "done.stderr.decode(errors='replace'), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))")
    done = subprocess.run([sys.executable, "-c", measure, sys.executable, "-m", "runner", *args], capture_output=True,
                          timeout=300, env={**__import__("os").environ, **target.env}, cwd=REPO)
    code, out, err, rss_kib = json.loads(done.stdout)
    return subprocess.CompletedProcess(args, code, out, err), rss_kib / 1024


# -- 3. an answer is not read past its cap ----------------------------------------------------------------

def test_a_host_answering_256_mib_is_not_read_past_the_cap(ssh_host, tmp_path, transport):
    """host.python is a stand-in that answers every call with 256 MiB of stdout (what a compromised host can do)."""
    flood = tmp_path / "python3-flood"
    flood.write_text(f"#!/bin/sh\nexec head -c {256 * MIB} /dev/zero\n")
    flood.chmod(0o755)
    target = ssh_target(ssh_host, transport, python=str(flood))
    job = write_job(tmp_path / "job.yaml", target, command=["true"])
    done, rss_mib = peak_rss(target, "submit", str(job), "--json")
    assert rss_mib < RSS_BOUND_MIB, f"peak RSS {rss_mib:.0f} MiB"
    assert done.returncode == 3 and json.loads(done.stdout)["error"] == "bad-answer", done.stderr
    assert "not read further" in json.loads(done.stdout)["message"]


def test_a_job_file_of_1_gib_is_refused_without_reading_it(tmp_path):
    target = local_target()
    job = write_job(tmp_path / "job.yaml", target, command=["true"])
    with open(job, "r+b") as fh:
        fh.truncate(1 << 30)  # sparse: costs no disk
    done, rss_mib = peak_rss(target, "submit", str(job), "--json")
    assert rss_mib < RSS_BOUND_MIB, f"peak RSS {rss_mib:.0f} MiB"
    assert done.returncode == 2 and "larger than" in json.loads(done.stdout)["message"]


# -- 6. a refused login, a changed host key ---------------------------------------------------------------

def refused_logins(ssh_host) -> int:
    """sshd -e logs each connection that failed to log in as `Connection closed by authenticating user …`."""
    text = (ssh_host.workdir / "sshd.log").read_text(errors="replace")
    return sum(1 for line in text.splitlines() if "authenticating user" in line)


def config_with(ssh_host, tmp_path: Path, old: str, new: str) -> Path:
    config = tmp_path / "ssh_config"
    config.write_text(ssh_host.ssh_config.read_text().replace(old, new))
    return config


def known_job(target: Target, job_id: str = "edges-known-job") -> str:
    """A job this controller knows (its record), on the target's host: what `status` asks the host about."""
    Store().save(JobRecord(job_id=job_id, name="edges", host=target.host, spec_path="job.yaml",
                           submitted_at=time.time(), last_state="RUNNING"))
    return job_id


def test_a_refused_login_is_auth_failed_and_tried_once(ssh_host, tmp_path, transport):
    stranger = tmp_path / "stranger_key"
    generate_key(stranger)  # a key the host does not accept
    config = config_with(ssh_host, tmp_path, str(ssh_host.key_path), str(stranger))
    target = ssh_target(ssh_host, transport, config)
    job_id = known_job(target)
    before = refused_logins(ssh_host)
    done = run_cli(target, "status", job_id, "--json")
    assert done.returncode == 3 and json.loads(done.stdout)["error"] == "auth-failed", done.stdout
    time.sleep(0.3)  # a window for sshd to log a retry, were there one
    assert refused_logins(ssh_host) - before == 1


def test_status_of_every_job_exits_3_for_a_changed_host_key(ssh_host, tmp_path, transport):
    config = config_with(ssh_host, tmp_path, str(ssh_host.known_hosts), str(ssh_host.wrong_known_hosts()))
    target = ssh_target(ssh_host, transport, config)
    known_job(target)
    done = run_cli(target, "status", "--json")
    assert done.returncode == 3, done.stdout
    assert [job["error"] for job in json.loads(done.stdout)] == ["host-key"]


# -- 4. a GPU the host lacks ------------------------------------------------------------------------------

def test_a_gpu_the_host_lacks_is_refused_naming_every_gpu_it_has(ssh_host, tmp_path):
    target = ssh_target(ssh_host, "openssh")
    ssh_host.set_gpu(count=4)
    try:
        for devices in ([99], [0, 99]):
            job = write_job(tmp_path / "job.yaml", target, command=["true"], gpu={"devices": devices,
                                                                               "min_free_mib": 1000})
            done = run_cli(target, "submit", str(job))
            assert done.returncode == 4, done.stderr.decode()
            has = done.stderr.decode().split("it has:")[1]
            assert all(f"{index} (GPU-" in has for index in range(4)), done.stderr.decode()
    finally:
        ssh_host.set_gpu()


# -- 5. the command's deadline reaches every host call -----------------------------------------------------

@pytest.fixture
def silent_host():
    """A TCP port on 127.0.0.1 that accepts connections and never says a word (a host that stopped answering)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    yield listener.getsockname()[1]
    listener.close()


def silent_run(port: int, transport: str, tmp_path: Path) -> tuple[Target, str]:
    """A fleet run of two hosts whose jobs started, both on the silent port, connect_timeout far above 2 s."""
    config = tmp_path / "ssh_config"
    config.write_text("")
    root = tmp_path / "root"
    host = {"address": "127.0.0.1", "port": port, "root": str(root), "transport": transport, "connect_timeout": 60}
    target = Target("ssh", host, root, {"RUNNER_SSH_CONFIG": str(config)})
    run = RunRecord(run_id="edges-silent-run", name="edges", spec_path="job.yaml", spec_sha256="0" * 64,
                    overrides=[], max_unavailable=2, stop_on_failure=False)
    for n in (1, 2):
        run.hosts.append(HostEntry(f"silent-{n}", known_job(target, f"edges-silent-{n}"), phase=STARTED))
    RunStore(Store()).save(run)
    return target, run.run_id


@pytest.mark.parametrize("command", ["status", "cancel", "results"])
def test_max_wait_bounds_every_host_call_of_a_fleet_command(silent_host, tmp_path, transport, command):
    target, run_id = silent_run(silent_host, transport, tmp_path)
    scale = Scale()
    started = time.monotonic()
    done = run_cli(target, command, run_id, "--max-wait", "2", "--json", timeout=120)
    took = time.monotonic() - started
    from runner.deadline import ROUND_TRIP_ALLOWANCE_S

    # at this machine's pace, and never as long as host.connect_timeout's 60 s the bug took
    assert took < min(2 + ROUND_TRIP_ALLOWANCE_S + scale(10), 50), f"{command} took {took:.0f} s"
    assert done.returncode in (1, 3), done.stderr.decode()


BELOW_THE_FRONT_ENDS = ("commands", "fleet", "remote")
FRONT_ENDS = ("cli", "mcp")


def functions_in(packages):
    """(module name, FunctionDef, whether it is a module's function (not a method), the names its module
    imports from other modules: {name: module}) of every function in runner/PACKAGE for each package."""
    for package in packages:
        for path in sorted((REPO / "runner" / package).glob("*.py")):
            tree = ast.parse(path.read_text())
            imported = {alias.asname or alias.name: node.module.split(".")[-1] for node in ast.walk(tree)
                        if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield path.stem, node, node in tree.body, imported


def _params(fn) -> list[str]:
    args = fn.args
    return [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]


def _has_default(fn, name: str) -> bool:
    args = fn.args
    positional = args.posonlyargs + args.args
    with_defaults = positional[len(positional) - len(args.defaults):]
    keyword = [a for a, default in zip(args.kwonlyargs, args.kw_defaults) if default is not None]
    return any(a.arg == name for a in with_defaults + keyword)


def test_no_command_below_the_front_ends_has_a_deadline_of_its_own():
    """Every `deadline` parameter below the front ends is required; every call of such a function (there and
    in the front ends) passes one; and no Deadline below the front ends is built from a constant (only from
    the command's own max_wait, timeout or deadline)."""
    below = list(functions_in(BELOW_THE_FRONT_ENDS))
    takes_deadline = {(module, fn.name): _params(fn).index("deadline")
                      for module, fn, top, _imported in below if top and "deadline" in _params(fn)}
    problems = [f"{module}.{fn.name}: `deadline` has a default" for module, fn, _top, _imported in below
                if "deadline" in _params(fn) and _has_default(fn, "deadline")]
    front = list(functions_in(FRONT_ENDS))
    made_by_a_front_end = {id(fn) for _module, fn, _top, _imported in front}  # the command's own deadline
    for module, fn, _top, imported in below + front:
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            target = _called(call, module, imported)
            if target in takes_deadline and not _passes_deadline(call, takes_deadline[target]):
                problems.append(f"{module}.{fn.name} calls {target[0]}.{target[1]} without the deadline")
            if id(fn) not in made_by_a_front_end and _builds_deadline(call) and not _from_a_variable(call):
                problems.append(f"{module}.{fn.name} builds a Deadline of its own: {ast.unparse(call)}")
    assert problems == []
    assert ("controller", "connect") in takes_deadline and ("targets", "status") in takes_deadline


def _called(call: ast.Call, module: str, imported: dict) -> tuple[str, str] | None:
    """(module, function) a call names: `controller.status(…)`, or a bare name (imported, or of the same module)."""
    if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name):
        return call.func.value.id, call.func.attr
    if isinstance(call.func, ast.Name):
        return imported.get(call.func.id, module), call.func.id
    return None


def _passes_deadline(call: ast.Call, position: int) -> bool:
    return any(k.arg == "deadline" for k in call.keywords) or len(call.args) > position


def _from_a_variable(call: ast.Call) -> bool:
    """Seconds that involve a variable (max_wait, what a deadline has left), not only constants (UPPER_CASE)."""
    return any(isinstance(n, ast.Name) and not n.id.isupper() for a in call.args for n in ast.walk(a))


def _builds_deadline(call: ast.Call) -> bool:
    func = call.func
    return (isinstance(func, ast.Name) and func.id == "Deadline") or \
        (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "Deadline")
