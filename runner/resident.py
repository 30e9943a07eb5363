"""The resident controller: one warm CLI per user, code and context, which forks a child for each command (on
Linux; RUNNER_RESIDENT=0 turns it off).

A command is mostly imports: an edited spec's submit spends ~130 of its ~150 ms of CPU importing click and
pydantic and building the spec's models before it does anything (docs/performance.md). On a loaded machine
each of those milliseconds is a share of a core. So `runner` hands its command to a server that imported all of
that once: the server forks, and the child takes the caller's argv, working directory, environment, umask and
standard input, output and error (the descriptors themselves, over the socket), runs the command as `runner`
would, and sends back its exit status, which the caller exits with.

- Where: $XDG_RUNTIME_DIR/runner, else $TMPDIR/runner-UID (0700 and the user's, else not used); one socket per
  code and context, named by the interpreter, the search path, every file of runner/ and remote_payload/ (name,
  size, mtime) and what else a process inherits (namespaces, root, cgroup, credentials, capabilities, limits,
  niceness): an edited or reinstalled runner gets a server of its own, the old one idles out, and a command
  run inside a sandbox runs there.
- When none answers, the command runs in its own process, as with RUNNER_RESIDENT=0, then starts a server for
  the next one (`python -m runner` with RUNNER_RESIDENT_SERVE naming its socket; detached, in a session of its
  own). A server ends after RUNNER_RESIDENT_IDLE seconds without a command (default 120, as the ssh masters'
  ControlPersist), and at once when its socket is removed or replaced.
- The caller stays the command's process for whoever runs it: SIGTERM and SIGHUP sent to it go to the child,
  SIGINT and SIGQUIT (a terminal's, which reach a whole foreground group) to the child's process group, from the
  moment the caller knows the child (one that comes before the child took the caller's dispositions waits for
  them); if the caller dies (SIGKILL, a tool's timeout) while its command runs, the child gets SIGTERM.
- The caller sends its command only once the child has said its pid: a server that does not fork within 10 s
  (still importing on a loaded machine), or ends first, ran nothing, and the caller runs the command itself.

Only os and sys are imported until the switch is read: with RUNNER_RESIDENT=0 a command pays one lookup.
"""
from __future__ import annotations

import os
import sys

SWITCH = "RUNNER_RESIDENT"
IDLE_ENV = "RUNNER_RESIDENT_IDLE"
SERVE_ENV = "RUNNER_RESIDENT_SERVE"  # set by start_server: this `python -m runner` is the server of that socket
DEFAULT_IDLE_S = 120.0
PACKAGE = os.path.dirname(os.path.abspath(__file__))
STAMPED = ("runner", "remote_payload")  # the packages whose files name the code a server runs
PID_WAIT_S = 10.0  # a server still importing (it listens first) is waited for this long, then the command runs here
SUN_PATH_MAX = 108  # a socket's path, NUL included (sockaddr_un on Linux)
PID, EXIT = b"P", b"X"  # the child's two messages, each with a 4-byte signed integer
NO_STATUS = ("runner: the resident controller's child ended without an exit status (RUNNER_RESIDENT=0 runs each "
             "command in its own process)\n")


_missed: list[str] = []  # the socket no server answered on, for after_here


def handed_over() -> int | None:
    """This command's exit status as the resident server's child ran it; None: run it here (the switch is off,
    no usable socket folder, or no server answered: after_here starts one for the next command)."""
    if os.environ.get(SWITCH) == "0":
        return None
    import socket

    path = socket_path()
    if path is None:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with conn:
        try:
            conn.connect(path)
        except OSError:
            _missed.append(path)
            return None
        try:
            conn.settimeout(PID_WAIT_S)
            pid = _read_int(conn, PID)  # the child's first word, before it has anything to run
            conn.settimeout(None)
        except OSError:
            pid = None
        if pid is None:
            return None  # nothing was sent, so nothing runs there: run it here
        forwarded: list[int] = []
        previous = _forward_signals(pid, forwarded)  # from here on a signal to this process is the command's
        try:
            _send_request(conn)
        except OSError:  # not all of it went: the child runs nothing
            _restore(previous)
            return None
        return _wait_exit(conn, forwarded)


def after_here() -> None:
    """After a command ran in its own process because no server answered: start one for the next command
    (now, so that its imports do not compete with this command's)."""
    if _missed:
        start_server(_missed.pop())


def socket_path() -> str | None:
    """This user's socket for this code and context; None off Linux, where the folder is not the user's alone,
    where the context cannot be read, or where the path is too long for a socket."""
    import stat

    if sys.platform != "linux":
        return None
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    folder = os.path.join(runtime, "runner") if runtime else os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                                          f"runner-{os.getuid()}")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    key = code_key()
    if key is None:
        return None
    path = os.path.join(folder, f"{key}.sock")
    return path if len(os.fsencode(path)) + len(".4194304") < SUN_PATH_MAX else None  # the server's private name too


def code_key() -> str | None:
    """A digest of the code a command would run and of the process it would run in: the interpreter, its
    search path past the script's folder, the name, size and mtime of every file of runner/ and
    remote_payload/ (what a server imported), and the caller's context (_context); None without /proc."""
    import hashlib

    context = _context()
    if context is None:
        return None
    digest = hashlib.blake2b(digest_size=10)
    digest.update("\0".join([sys.executable, sys.version, PACKAGE, *sys.path[1:], *context])
                  .encode("utf-8", "surrogateescape"))
    top = os.path.dirname(PACKAGE)
    for package in STAMPED:
        for name, size, mtime in sorted(_files(os.path.join(top, package))):
            digest.update(f"\0{name}\0{size}\0{mtime}".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def _context() -> list[str] | None:
    """What a process inherits besides its argv, directory, environment, umask and descriptors (those travel
    with each command): its namespaces, root, cgroup, credentials, capabilities, seccomp, niceness and
    limits. A server serves only callers whose context is its own, so a command run under `unshare`, `ip netns
    exec`, a cgroup, `nice`, `ulimit` or `setpriv` gets a server started there, never one from outside."""
    import resource

    words = []
    try:
        for name in sorted(os.listdir("/proc/self/ns")):
            words.append(f"{name}={os.readlink(f'/proc/self/ns/{name}')}")
        with open("/proc/self/cgroup") as cgroup:
            words.append(cgroup.read())
        with open("/proc/self/status") as status:
            words += [line for line in status if line.startswith(("Cap", "NoNewPrivs", "Seccomp"))]
    except OSError:
        return None  # nothing to compare: never served
    root = os.stat("/")
    words.append(f"root={root.st_dev}:{root.st_ino} ids={os.getresuid()}{os.getresgid()}{sorted(os.getgroups())}"
                 f" nice={os.getpriority(os.PRIO_PROCESS, 0)}")
    words += [f"{name}={resource.getrlimit(getattr(resource, name))}" for name in sorted(dir(resource))
              if name.startswith("RLIMIT_")]
    return words


def _files(folder: str):
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            if entry.name != "__pycache__":
                yield from _files(entry.path)
        else:
            st = entry.stat(follow_symlinks=False)
            yield entry.path, st.st_size, st.st_mtime_ns


def start_server(path: str) -> None:
    """A server for this code (`python -m runner` told so by SERVE_ENV), detached, in its own session, its
    output nowhere; from the package's parent folder, so that `-m` imports this very package."""
    import subprocess

    try:
        subprocess.Popen([sys.executable, "-m", "runner"], cwd=os.path.dirname(PACKAGE),
                         env={**os.environ, SERVE_ENV: path}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        pass  # the next command tries again; this one runs here


def _send_request(conn) -> None:
    import array
    import json
    import socket
    import struct

    import signal

    mask = os.umask(0o077)
    os.umask(mask)
    body = json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ), "umask": mask,
                       "ignored": [int(n) for n in _handed_signals() if signal.getsignal(n) == signal.SIG_IGN],
                       "blocked": sorted(int(n) for n in signal.pthread_sigmask(signal.SIG_BLOCK, []))}).encode()
    conn.sendmsg([struct.pack("!I", len(body))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
    conn.sendall(body)


def _read_int(conn, tag: bytes) -> int | None:
    import struct

    data = _recv_exact(conn, 5)
    return struct.unpack("!i", data[1:])[0] if data is not None and data[:1] == tag else None


def _recv_exact(conn, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _forward_signals(pid: int, forwarded: list[int]) -> dict:
    """Signals this process gets go on to the child `pid` (SIGINT and SIGQUIT to its group), each appended to
    `forwarded`; the handlers they replaced."""
    import signal

    previous = {}
    to_group = (signal.SIGINT, signal.SIGQUIT)  # a terminal's: they reach a command's whole foreground group

    def forward(signum, _frame) -> None:
        forwarded.append(signum)
        try:
            os.killpg(pid, signum) if signum in to_group else os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        if signal.getsignal(signum) != signal.SIG_IGN:  # one the caller ignores, its command ignores too
            previous[signum] = signal.signal(signum, forward)
    return previous


def _restore(handlers: dict) -> None:
    import signal

    for signum, handler in handlers.items():
        signal.signal(signum, handler)


def _wait_exit(conn, forwarded: list[int]) -> int:
    """The child's exit status (128 + the last signal forwarded when it ended without one)."""
    try:
        code = _read_int(conn, EXIT)
    except OSError:
        code = None
    if code is not None:
        return code
    if forwarded:
        return 128 + forwarded[-1]
    sys.stderr.write(NO_STATUS)
    return 1


# The server: its own process, started by start_server.

def serve(path: str, run_here) -> None:
    """Import every command's modules, own `path`, and fork a child for each caller until idle or displaced;
    a child runs its caller's command with run_here (the entry's: the command in sys.argv, in this process)."""
    import gc
    import socket
    import time

    idle_s = _idle_s()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    own = _claim(listener, path)  # first: a command meanwhile waits for this server, never starts another
    if own is None:
        return
    _warm()
    gc.freeze()  # what the children share stays shared: the collector does not walk or write it
    listener.settimeout(1.0)
    last = time.monotonic()
    try:
        while time.monotonic() - last < idle_s and _still(path, own):
            _reap()
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            last = time.monotonic()
            if _peer_uid(conn) != os.getuid():
                conn.close()
                continue
            if os.fork() == 0:
                listener.close()
                _child(conn, run_here)  # never returns
            conn.close()
    finally:
        if _still(path, own):
            os.unlink(path)
        listener.close()


def _warm() -> None:
    """Every module of the package but the entry (running as __main__), imported: what a command would import."""
    import importlib
    import pkgutil

    import runner

    for module in pkgutil.walk_packages(runner.__path__, "runner."):
        if module.name != "runner.__main__":
            try:
                importlib.import_module(module.name)
            except Exception:  # noqa: BLE001 - an optional dependency missing: the child imports it, or says so
                pass


def _idle_s() -> float:
    try:
        return max(1.0, float(os.environ.get(IDLE_ENV, DEFAULT_IDLE_S)))
    except ValueError:
        return DEFAULT_IDLE_S


def _claim(listener, path: str) -> int | None:
    """Bind under a private name, then link it to `path` unless a live server has it: the socket's inode."""
    import socket

    private = f"{path}.{os.getpid()}"
    listener.bind(private)
    listener.listen(64)
    try:
        os.link(private, path)
    except FileExistsError:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.replace(private, path)  # a dead server's socket
        else:
            probe.close()
            os.unlink(private)
            return None
    else:
        os.unlink(private)
    return os.stat(path).st_ino


def _still(path: str, inode: int) -> bool:
    try:
        return os.stat(path).st_ino == inode
    except OSError:
        return False


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _peer_uid(conn) -> int:
    import socket
    import struct

    _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return uid


def _child(conn, run_here) -> None:
    """Take the caller's process state, run its command as `runner` would, send its exit status, exit."""
    import struct

    code, running = 1, None
    try:
        os.setpgid(0, 0)  # the caller forwards its signals to this group
        _hold_signals()
        conn.sendall(PID + struct.pack("!i", os.getpid()))
        request = _receive(conn)
        if request is None:
            os._exit(0)  # the caller went before saying what to run: nothing ran
        _adopt(request)
        running = _watch_caller(conn)
        code = _run_command(run_here)
    except KeyboardInterrupt:  # forwarded before the command began
        code = 130
    except BaseException:  # noqa: BLE001 - said on the caller's stderr, as an uncaught error would be
        import traceback

        traceback.print_exc()
    finally:
        _finish()
        if running is not None:
            running.clear()
        try:
            conn.sendall(EXIT + struct.pack("!i", code))
        except OSError:
            pass
        os._exit(code)


def _receive(conn) -> dict | None:
    import array
    import json
    import socket
    import struct

    fds = array.array("i")
    data, ancillary, _flags, _addr = conn.recvmsg(4, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    body = _recv_exact(conn, struct.unpack("!I", data)[0]) if len(data) == 4 else None
    if body is None or len(fds) != 3:
        return None
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    return json.loads(body)


def _handed_signals():
    """The signals whose disposition a caller hands on: those it may ignore or Python sets at its start."""
    import signal

    return (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE, signal.SIGXFSZ,
            signal.SIGUSR1, signal.SIGUSR2, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGALRM)


def _hold_signals() -> None:
    """Until the caller's dispositions are taken, what it forwards waits: blocked, and not ignored (an ignored
    signal is dropped, and the server may have been started by a process that ignored SIGINT)."""
    import signal

    signal.pthread_sigmask(signal.SIG_BLOCK, _handed_signals())
    for signum in _handed_signals():
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)


def _adopt(request: dict) -> None:
    """The caller's argv, directory, umask, environment, ignored and blocked signals; standard streams on its
    descriptors."""
    import io
    import signal

    ignored = set(request["ignored"])
    for signum in ignored & set(_handed_signals()):
        signal.signal(signum, signal.SIG_IGN)  # a pending one is dropped, as the caller would have
    signal.pthread_sigmask(signal.SIG_SETMASK, request["blocked"])  # one held meanwhile is delivered now
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = request["argv"]
    write_through = bool(os.environ.get("PYTHONUNBUFFERED"))

    def stream(fd: int, mode: str, errors: str, line_buffering: bool):
        raw = io.FileIO(fd, mode, closefd=False)
        buffered = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
        return io.TextIOWrapper(buffered, encoding=encoding, errors=errors, line_buffering=line_buffering,
                                write_through=write_through and mode == "w")

    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"  # the server's: the interpreter's choice
    sys.stdin = stream(0, "r", "strict", False)
    sys.stdout = stream(1, "w", "strict", os.isatty(1))
    sys.stderr = stream(2, "w", "backslashreplace", True)


def _watch_caller(conn):
    """A caller that goes away while its command runs (killed, its tool's timeout) takes the command with it:
    SIGTERM to this process, which its subprocesses outlive as they would the caller's own. The event: set
    while the command runs."""
    import signal
    import threading

    running = threading.Event()
    running.set()

    def watch() -> None:
        try:
            while conn.recv(1):
                pass
        except OSError:
            pass
        if running.is_set():
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="runner-resident-caller", daemon=True).start()
    return running


def _run_command(run_here) -> int:
    try:
        run_here()
    except SystemExit as done:
        return _status(done.code)
    except KeyboardInterrupt:
        return 130
    return 0


def _status(code) -> int:
    """SystemExit's code as the interpreter turns it into a status (a message goes to stderr, then 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write(f"{code}\n")
    return 1


def _finish() -> None:
    """What an exit does before the process ends: the non-daemon threads joined, atexit's functions run, the
    streams flushed (the caller returns when the status comes, so everything printed is out by then)."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for out in (sys.stdout, sys.stderr):
        try:
            out.flush()
        except (OSError, ValueError):
            pass

