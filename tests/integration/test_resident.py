"""The resident controller (runner/resident.py), through real processes: a warm server forks
the caller's command, which runs with the caller's argv, directory, environment and standard streams and
exits with the caller's status; signals sent to the caller reach it, a killed caller takes it along; a server
ends when idle; edited code gets a server of its own; a folder others could enter is never used.

Each test has its own XDG_RUNTIME_DIR (short: a socket's path has 108 bytes), so its server is its own; the
fixture ends it. `probe` runs a command as `runner` would and says on its last stderr line whether a server
ran it (SERVED) or it would have run in its own process (HERE; exit 99).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_helpers import REPO, local_target, pid_alive, wait_for, write_job
from tests.harness.pace import Scale
from tests.hosts._proc import shared_tmpdir

WAIT_S = 60  # "does not hang": every wait's bound, scaled by the machine's pace (tests/harness/pace.py)

# A probe that waits for a server's child as long as any wait here (WAIT_S): "served" must not depend on how soon a
# loaded machine schedules the server (a stall past resident.PID_WAIT_S runs the command here, as it should).
# Before its last line it says how long the hand-over took and which socket had no server, if any.
PROBE_AS_SHIPPED = ("import sys, time\nfrom runner import resident\nsys.argv = ['runner', *sys.argv[1:]]\n"
                    "began = time.monotonic()\ncode = resident.handed_over()\n"
                    "print(f'hand-over {time.monotonic() - began:.3f} s, no server on {resident._missed}', "
                    "file=sys.stderr)\n"
                    "print('SERVED' if code is not None else 'HERE', file=sys.stderr)\n"
                    "resident.after_here()\n"
                    "sys.exit(99 if code is None else code)\n")
PROBE = PROBE_AS_SHIPPED.replace("from runner import resident\n",
                                 f"from runner import resident\nresident.PID_WAIT_S = {WAIT_S}\n")
assert PROBE != PROBE_AS_SHIPPED


@pytest.fixture
def place():
    """(env with the switch on and a private XDG_RUNTIME_DIR, that dir); its servers are ended afterwards."""
    top = shared_tmpdir("rr-")
    xdg = top / "x"
    xdg.mkdir(mode=0o700)
    env = {**os.environ, "RUNNER_RESIDENT": "1", "XDG_RUNTIME_DIR": str(xdg), "RUNNER_STATE_DIR": str(top / "s")}
    try:
        yield env, xdg
    finally:
        for sock in (xdg / "runner").glob("*.sock") if (xdg / "runner").exists() else []:
            pid = server_pid(sock)
            if pid:
                os.kill(pid, signal.SIGTERM)
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def scaled() -> Scale:
    return Scale()


def probe(env: dict, *argv: str, cwd: Path = REPO, timeout: float = 120, **popen) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE, *argv], env={**env, "PYTHONPATH": str(REPO)}, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, **popen)


def served(done: subprocess.CompletedProcess) -> bool:
    return done.stderr.rstrip().splitlines()[-1] == "SERVED"


def socket_of(env: dict) -> Path:
    done = subprocess.run([sys.executable, "-c", "from runner import resident; print(resident.socket_path())"],
                          env={**env, "PYTHONPATH": str(REPO)}, cwd=REPO, capture_output=True, text=True, check=True)
    return Path(done.stdout.strip())


def server_pid(sock: Path) -> int | None:
    """The pid of the server listening on `sock` (its peer credentials); None when none answers."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(sock))
        pid, _uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return pid
    except OSError:
        return None
    finally:
        conn.close()  # the child it forked for this connection hears nothing and ends


def warm_server(env: dict, wait_s: float, **popen) -> int:
    """Start this env's server with a command of its own (run here), and wait until it answers: its pid."""
    first = probe(env, "--version", **popen)
    assert first.returncode == 99 and first.stderr.rstrip().endswith("HERE"), first.stderr
    sock = socket_of(env)
    wait_for(lambda: server_pid(sock) is not None, timeout=wait_s, what=f"a server on {sock}")
    pid = server_pid(sock)
    assert pid is not None
    return pid


def children(pid: int) -> set[int]:
    try:
        return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except FileNotFoundError:
        return set()


def test_a_served_command_runs_with_the_callers_directory_environment_streams_and_status(place, tmp_path, scaled):
    env, _ = place
    warm_server(env, scaled(WAIT_S))
    version = probe(env, "--version")
    assert served(version) and version.returncode == 0 and "runner, version" in version.stdout

    missing = probe(env, "submit", "missing.yaml", cwd=tmp_path)
    assert served(missing) and missing.returncode == 2
    assert "missing.yaml" in missing.stderr and "no such file" in missing.stderr

    target = local_target()
    write_job(tmp_path / "job.yaml", target, command=["true"], name="resident")
    submitted = probe(env, "submit", "job.yaml", "--json", cwd=tmp_path)  # relative: the caller's directory
    assert served(submitted) and submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["job_id"]
    mine = probe(env, "list", "--json")
    other = probe({**env, "RUNNER_STATE_DIR": str(tmp_path / "other-state")}, "list", "--json")
    assert served(mine) and served(other)
    assert job_id in mine.stdout and job_id not in other.stdout  # each command's own RUNNER_STATE_DIR


def test_a_killed_caller_takes_its_command_and_signals_reach_it_as_the_caller_takes_them(place, tmp_path, scaled):
    """The server is started by a command that ignores SIGINT, as a background job of a script does (CI's
    pytest runs so): each child takes its own caller's dispositions instead. A caller killed, or sent SIGINT
    while it takes SIGINT, ends its command; one that ignores SIGINT (in its own process it would go on) goes
    on until SIGTERM. Each signal is sent as soon as the child exists: it may not have its command yet."""
    env, _ = place
    server = warm_server(env, scaled(WAIT_S), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    target = local_target()
    spec = write_job(tmp_path / "job.yaml", target, command=["sleep", "300"], name="long")
    job_id = json.loads(probe(env, "submit", str(spec), "--json").stdout)["job_id"]
    try:
        for sig, sigint in ((signal.SIGKILL, signal.SIG_DFL), (signal.SIGTERM, signal.SIG_DFL),
                            (signal.SIGINT, signal.SIG_DFL), (signal.SIGINT, signal.SIG_IGN)):
            before = children(server)
            caller = subprocess.Popen([sys.executable, "-c", PROBE, "tail", job_id, "-f", "--max-wait", "300"],
                                      env={**env, "PYTHONPATH": str(REPO)}, cwd=REPO, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
            wait_for(lambda: children(server) - before, timeout=scaled(WAIT_S), what="the tail's child")
            (child,) = children(server) - before
            assert caller.poll() is None and pid_alive(child)
            caller.send_signal(sig)
            if sigint == signal.SIG_IGN:
                time.sleep(2)
                assert caller.poll() is None and pid_alive(child), "a SIGINT the caller ignores ended its command"
                caller.send_signal(signal.SIGTERM)
            caller.wait(timeout=scaled(WAIT_S))
            wait_for(lambda: not pid_alive(child), timeout=scaled(WAIT_S), what=f"the command's end after {sig.name}")
            if sig == signal.SIGINT and sigint == signal.SIG_DFL:
                assert caller.returncode not in (0, 99), caller.stderr.read()
            if sig == signal.SIGTERM:  # the command died of it: so does its caller, as its own process would
                assert caller.returncode == -signal.SIGTERM, caller.stderr.read()
            caller.stderr.close()
    finally:
        probe(env, "cancel", job_id)


def test_an_idle_server_ends_and_removes_its_socket(place, scaled):
    env, _ = place
    env = {**env, "RUNNER_RESIDENT_IDLE": "1"}
    pid = warm_server(env, scaled(WAIT_S))
    sock = socket_of(env)
    wait_for(lambda: not pid_alive(pid), timeout=scaled(WAIT_S), what="the idle server's end")
    assert not sock.exists()
    assert probe(env, "--version").stderr.rstrip().endswith("HERE")  # and the next command starts another


def test_a_dead_servers_socket_is_replaced(place, scaled):
    env, _ = place
    sock = socket_of(env)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))
    stale.close()  # the file stays, nobody listens
    warm_server(env, scaled(WAIT_S))
    assert served(probe(env, "--version"))


def test_a_folder_others_can_enter_is_never_used(place):
    env, xdg = place
    (xdg / "runner").mkdir(mode=0o755)
    (xdg / "runner").chmod(0o755)
    done = probe(env, "--version")
    assert done.returncode == 99 and done.stderr.rstrip().endswith("HERE")
    time.sleep(1)
    assert list((xdg / "runner").iterdir()) == []  # no server was started on it


def test_edited_code_upgraded_packages_and_interpreter_flags_name_another_server(tmp_path):
    copy, site = tmp_path / "c", tmp_path / "site-packages"
    for package in ("runner", "remote_payload"):
        shutil.copytree(REPO / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    site.mkdir()

    def key(*flags: str) -> str:
        return subprocess.run([sys.executable, *flags, "-c", "from runner import resident; print(resident.code_key())"],
                              cwd=copy, env={**os.environ, "PYTHONPATH": f"{copy}:{site}"}, capture_output=True,
                              text=True, check=True).stdout.strip()

    first = key()
    assert key() == first
    assert key("-W", "error") != first  # warnings as errors: a server of its own
    with open(copy / "remote_payload" / "contract.py", "a") as edited:  # the host side counts too
        edited.write("\n# edited\n")
    second = key()
    assert second != first
    (site / "newer-1.0.dist-info").mkdir()  # what pip does to site-packages on an install or upgrade
    assert key() != second


def test_a_caller_in_another_context_is_not_served_from_outside_it(place, tmp_path, scaled):
    """A command under `unshare --mount` sees its own mounts: a server of the caller's outside context would
    write through the tmpfs laid over the state dir. Under `nice`, likewise a server of its own."""
    env, _ = place
    outside = warm_server(env, scaled(WAIT_S))
    state = tmp_path / "state"
    state.mkdir()
    inside = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             f'mount -t tmpfs tmpfs "{state}" && exec "$0" -c "$1" list --json', sys.executable, PROBE],
                            env={**env, "PYTHONPATH": str(REPO), "RUNNER_STATE_DIR": str(state)}, cwd=REPO,
                            capture_output=True, text=True, timeout=scaled(WAIT_S))
    assert inside.returncode == 99 and inside.stderr.rstrip().endswith("HERE"), inside.stderr
    niced = subprocess.run(["nice", "-n", "3", sys.executable, "-c", PROBE, "--version"],
                           env={**env, "PYTHONPATH": str(REPO)}, cwd=REPO, capture_output=True, text=True,
                           timeout=scaled(WAIT_S))
    assert niced.returncode == 99 and niced.stderr.rstrip().endswith("HERE"), niced.stderr
    assert list(state.iterdir()) == []  # what the command inside wrote went to its tmpfs
    assert served(probe(env, "--version")) and server_pid(socket_of(env)) == outside
    # A caller that names the outside server's socket itself is refused by it (its context is checked).
    naming = PROBE.replace("from runner import resident\n",
                           "from runner import resident\nresident.socket_path = lambda: sys.argv.pop(1)\n")
    escape = subprocess.run(["nice", "-n", "3", sys.executable, "-c", naming, str(socket_of(env)), "--version"],
                            env={**env, "PYTHONPATH": str(REPO)}, cwd=REPO, capture_output=True, text=True,
                           timeout=scaled(WAIT_S))
    assert escape.returncode == 99 and escape.stderr.rstrip().endswith("HERE"), escape.stderr
    assert server_pid(socket_of(env)) == outside


def test_runner_resident_0_runs_every_command_in_its_own_process(place):
    env, xdg = place
    env = {**env, "RUNNER_RESIDENT": "0"}
    for _ in range(2):
        done = probe(env, "--version")
        assert done.returncode == 99 and done.stderr.rstrip().endswith("HERE")
    time.sleep(1)
    assert not (xdg / "runner").exists()  # no server, no socket folder


FAKE_SERVER = """
import json, os, sys, threading, time
from runner import resident

def run_here():  # a command that prints what it was given, then leaves a thread that exit must wait for
    print(time.tzname[0], repr(sys.stdin.read()), os.environ.get("MARK"), sys.argv[1:], flush=True)
    threading.Thread(target=time.sleep, args=(float(os.environ.get("LINGER", "0")),)).start()

resident.serve(json.dumps({"socket": sys.argv[1], "package": resident.PACKAGE}), run_here)
"""


def test_the_child_takes_time_zone_and_stdin_and_a_sigint_while_it_ends_leaves_the_server_alive(place, scaled):
    """A server whose command is a stand-in (resident.serve with its own run_here), on this context's socket:
    the child sees the caller's TZ and stdin byte for byte; a SIGINT that reaches it while its exit waits for a
    thread ends the command (the caller dies of SIGINT, as its own process would), never the server."""
    env, _ = place
    sock = socket_of(env)
    server = subprocess.Popen([sys.executable, "-c", FAKE_SERVER, str(sock)], env={**env, "PYTHONPATH": str(REPO)},
                              cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        wait_for(lambda: server_pid(sock) == server.pid, timeout=scaled(WAIT_S), what="the stand-in server")
        done = subprocess.run([sys.executable, "-c", PROBE, "a"], input=b"x\r\ny\n", capture_output=True,
                              env={**env, "PYTHONPATH": str(REPO), "TZ": "ABC-9", "MARK": "m1"}, cwd=REPO,
                              timeout=scaled(WAIT_S))
        assert served(subprocess.CompletedProcess([], done.returncode, "", done.stderr.decode())), done.stderr
        assert done.returncode == 0 and done.stdout == b"ABC 'x\\r\\ny\\n' m1 ['a']\n"

        caller = subprocess.Popen([sys.executable, "-c", PROBE, "b"], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
                                  env={**env, "PYTHONPATH": str(REPO), "LINGER": "30"},
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        assert caller.stdout.readline().endswith(b"['b']\n")  # printed: the command is ending, its thread waited for
        time.sleep(0.5)
        caller.send_signal(signal.SIGINT)
        caller.wait(timeout=scaled(WAIT_S))
        assert caller.returncode == -signal.SIGINT, caller.stderr.read()
        assert server.poll() is None and sock.exists() and server_pid(sock) == server.pid
        assert served(probe(env, "c"))
    finally:
        server.kill()
        server.wait()


def test_a_caller_with_a_standard_stream_closed_runs_its_command_itself(place, scaled):
    """Its socket would take the closed number and the command would read or write its own connection (a
    `runner mcp <&-` waited for good)."""
    env, _ = place
    warm_server(env, scaled(WAIT_S))
    for closing in ("<&-", ">&-", "2>&-"):
        done = subprocess.run(["sh", "-c", f'exec "$0" -c "$1" --version {closing}', sys.executable, PROBE],
                              env={**env, "PYTHONPATH": str(REPO)}, cwd=REPO, capture_output=True, text=True,
                              timeout=scaled(WAIT_S))
        assert done.returncode == 99, (closing, done.returncode, done.stderr)  # HERE: run in its own process


def test_a_server_outlives_its_idle_time_while_a_command_runs(place, scaled):
    """A command longer than RUNNER_RESIDENT_IDLE keeps its server (its process group stays one a terminal
    can stop); the idle time counts from its end."""
    env, _ = place
    sock, idle_s = socket_of(env), scaled(2)
    server = subprocess.Popen([sys.executable, "-c", FAKE_SERVER, str(sock)], cwd=REPO,
                              env={**env, "PYTHONPATH": str(REPO), "RUNNER_RESIDENT_IDLE": str(idle_s)},
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        wait_for(lambda: server_pid(sock) == server.pid, timeout=scaled(WAIT_S), what="the stand-in server")
        done = subprocess.run([sys.executable, "-c", PROBE, "long"], stdin=subprocess.DEVNULL, capture_output=True,
                              env={**env, "PYTHONPATH": str(REPO), "LINGER": str(2 * idle_s + 1)}, cwd=REPO,
                              timeout=scaled(WAIT_S))
        assert done.returncode == 0 and done.stdout.endswith(b"['long']\n"), done.stderr
        assert server.poll() is None  # twice its idle time of command: still here, idle from the command's end
        server.wait(timeout=scaled(WAIT_S))  # and gone once idle after it
        assert not sock.exists()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_a_server_that_never_forks_costs_a_command_two_seconds_not_its_bound(place, scaled):
    """A socket that takes the connection and never answers (a server stopped, or still importing on a loaded
    machine): the command runs in its own process after resident.PID_WAIT_S, well inside the round trip a
    command may take past its --max-wait."""
    env, _ = place
    sock = socket_of(env)
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(str(sock))
    mute.listen(8)  # never accepted
    try:
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-c", PROBE_AS_SHIPPED, "--version"], env={**env, "PYTHONPATH": str(REPO)},
                              cwd=REPO, capture_output=True, text=True, timeout=scaled(WAIT_S))
        assert done.returncode == 99 and done.stderr.rstrip().endswith("HERE"), done.stderr
        assert time.monotonic() - began < scaled(4)  # PID_WAIT_S (2) and an interpreter's start: not a hang
    finally:
        mute.close()
