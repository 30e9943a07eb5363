"""The resident controller: one warm CLI per user, code and context, which forks a child for each command (on
Linux; RUNNER_RESIDENT=0 turns it off).

A command is mostly imports: an edited spec's submit spends ~130 of its ~150 ms of CPU importing click and
pydantic and building the spec's models before it does anything (docs/performance.md). On a loaded machine
each of those milliseconds is a share of a core. So `runner` hands its command to a server that imported all of
that once: the server forks, and the child takes the caller's argv, working directory, environment, umask,
signal dispositions and mask, and standard input, output and error (the descriptors themselves, over the
socket), runs the command as `runner` would, and sends back its exit status, which the caller exits with (or
the signal it died of, which the caller dies of).

- Where: $XDG_RUNTIME_DIR/runner, else $TMPDIR/runner-UID (0700 and the user's, else not used); one socket per
  code and context, named by the interpreter (its flags, warnings options and streams' encodings too), its
  search path (site-packages' mtime: an install changes it), every file of runner/ and remote_payload/ (name,
  size, mtime) and what else a process inherits (namespaces, root, cgroup, credentials, capabilities, LSM
  label, seccomp, limits, niceness): an edited or upgraded runner gets a server of its own, the old one idles
  out, and a command run inside a sandbox runs there. The server checks each caller's context against its own
  (by the caller's pid, from the socket's credentials), so a caller that names another context's socket is
  not served by it.
- When none answers, the command runs in its own process, as with RUNNER_RESIDENT=0, then starts a server for
  the next one (`python -c` told so by RUNNER_RESIDENT_SERVE; detached, in a session of its own, with the
  caller's search path). A server ends RUNNER_RESIDENT_IDLE seconds after its last command ended (default 120,
  as the ssh masters' ControlPersist), and at once when its socket is removed or replaced.
- A caller with descriptor 0, 1 or 2 closed runs its command itself (its socket would take the number).
- The caller stays the command's process for whoever runs it: SIGTERM and SIGHUP sent to it go to the child;
  SIGINT, SIGQUIT, SIGWINCH, SIGTSTP and SIGCONT (a terminal's, which reach a whole foreground group) to the
  child's process group, a SIGTSTP stopping the caller after it; one that comes before the child took the
  caller's dispositions waits for them. If the caller dies (SIGKILL, a tool's timeout) while its command runs,
  the child gets SIGTERM. The child has no controlling terminal (nothing in runner opens /dev/tty: ssh runs
  with BatchMode=yes).
- The caller sends its command only once the child has said its pid: a server that does not fork within 2 s
  (still importing on a loaded machine), or ends first, ran nothing, and the caller runs the command itself.

Only os and sys are imported until the switch is read: with RUNNER_RESIDENT=0 a command pays one lookup.
"""
from __future__ import annotations

import os
import sys

SWITCH = "RUNNER_RESIDENT"
IDLE_ENV = "RUNNER_RESIDENT_IDLE"
SERVE_ENV = "RUNNER_RESIDENT_SERVE"  # set by start_server: this interpreter is the server of that socket
DEFAULT_IDLE_S = 120.0
PACKAGE = os.path.dirname(os.path.abspath(__file__))
STAMPED = ("runner", "remote_payload")  # the packages whose files name the code a server runs
PID_WAIT_S = 2.0  # a server still importing (it listens first) is waited for this long, then the command runs here:
# well inside the round trip a command may take past its --max-wait (deadline.ROUND_TRIP_ALLOWANCE_S)
SUN_PATH_MAX = 108  # a socket's path, NUL included (sockaddr_un on Linux)
PID, EXIT = b"P", b"X"  # the child's two messages, each with a 4-byte signed integer (EXIT -N: died of signal N)
NO_STATUS = ("runner: the resident controller's child ended without an exit status (RUNNER_RESIDENT=0 runs each "
             "command in its own process)\n")
STATUS_LINES = ("Uid:", "Gid:", "Groups:", "Cap", "NoNewPrivs:", "Seccomp")  # of /proc/PID/status, in a context

_missed: list[str] = []  # the socket no server answered on, for after_here


# The caller: the `runner` process.

def handed_over() -> int | None:
    """This command's exit status as the resident server's child ran it; None: run it here (the switch is off,
    no usable socket folder, or no server answered: after_here starts one for the next command)."""
    if os.environ.get(SWITCH) == "0":
        return None
    import socket

    path = socket_path()
    if path is None or not _streams_open():
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with conn:
        try:
            conn.connect(path)
        except OSError:
            _missed.append(path)
            return None
        try:
            if _peer(conn)[1] != os.getuid():
                return None  # not ours (the folder is 0700 and ours: cannot happen; never hand it our env)
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
        return _wait_exit(conn, forwarded, previous)


def _streams_open() -> bool:
    """Descriptors 0, 1 and 2 all open: a closed one would be this process's own socket by the time it is
    sent (the lowest free number), and the command would read or write its own connection."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            return False
    return True


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
    """A digest of the code a command would run and of the process it would run in: the interpreter, its flags,
    warnings options and streams' encodings, its search path (_search_path), the name, size and mtime of
    every file of runner/ and remote_payload/ (what a server imported), and the caller's context (_context);
    None without /proc."""
    import hashlib

    context = _context("self")
    if context is None:
        return None
    streams = [f"{s.encoding}:{s.errors}:{s.write_through}" for s in (sys.stdin, sys.stdout, sys.stderr)
               if hasattr(s, "write_through")]
    digest = hashlib.blake2b(digest_size=10)
    digest.update("\0".join([sys.executable, sys.version, repr(sys.flags), repr(sys.warnoptions),
                             repr(sys._xoptions), *streams, PACKAGE, *_search_path(), *context])
                  .encode("utf-8", "surrogateescape"))
    top = os.path.dirname(PACKAGE)
    for package in STAMPED:
        for name, size, mtime in sorted(_files(os.path.join(top, package))):
            digest.update(f"\0{name}\0{size}\0{mtime}".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def _search_path() -> list[str]:
    """sys.path past the script's folder (the folder `python -m` runs from: a key per folder would be a server
    per folder), each site-packages with its mtime (an install or an upgrade changes it)."""
    words = []
    for entry in sys.path[1:]:
        try:
            installed = os.path.basename(entry) in ("site-packages", "dist-packages")
            words.append(f"{entry}@{os.stat(entry).st_mtime_ns}" if installed else entry)
        except OSError:
            words.append(entry)
    return words


def _context(pid: str) -> list[str] | None:
    """What process `pid` ("self" or a number) has inherited besides its argv, directory, environment, umask,
    signals and descriptors (those travel with each command): its namespaces, root, cgroup, credentials,
    capabilities, seccomp, LSM label, limits and niceness. None where /proc does not say (never served)."""
    proc = f"/proc/{pid}"
    try:
        words = [f"{name}={os.readlink(f'{proc}/ns/{name}')}" for name in sorted(os.listdir(f"{proc}/ns"))]
        root = os.stat(f"{proc}/root")
        words.append(f"root={root.st_dev}:{root.st_ino}")
        for name in ("cgroup", "limits"):
            with open(f"{proc}/{name}") as text:
                words.append(text.read())
        with open(f"{proc}/status") as status:
            words += [line for line in status if line.startswith(STATUS_LINES)]
        with open(f"{proc}/stat") as stat:
            words.append("nice=" + stat.read().rsplit(")", 1)[1].split()[16])
    except (OSError, IndexError):
        return None
    try:
        with open(f"{proc}/attr/current") as label:
            words.append(label.read())
    except OSError:
        pass  # no LSM that says
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
    """A server for this code: this interpreter with its flags and this process's search path, told so by
    SERVE_ENV; detached, in its own session, in /, its output nowhere."""
    import json
    import subprocess

    boot = ("import json, os, sys\n"
            f"sys.path[:] = json.loads(os.environ[{SERVE_ENV!r}])['path']\n"
            "from runner.__main__ import run\nrun()\n")
    told = json.dumps({"socket": path, "package": PACKAGE, "path": [os.path.abspath(sys.path[0] or os.curdir),
                                                                   *sys.path[1:]]})
    try:
        flags: list[str] = getattr(subprocess, "_args_from_interpreter_flags", list)()  # -W, -X, -O…
        subprocess.Popen([sys.executable, *flags, "-c", boot], cwd="/",
                         env={**os.environ, SERVE_ENV: told}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        pass  # the next command tries again; this one runs here


def _send_request(conn) -> None:
    import array
    import json
    import signal
    import socket
    import struct

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


def _peer(conn) -> tuple[int, int]:
    """(pid, uid) of the process at the other end, as the kernel saw it connect or listen."""
    import socket
    import struct

    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def _forward_signals(pid: int, forwarded: list[int]) -> dict:
    """Signals this process gets go on to the child `pid` (a terminal's to its group), each appended to
    `forwarded`; a SIGTSTP stops this process too, after the child's group. The handlers they replaced."""
    import signal

    to_group = {signal.SIGINT, signal.SIGQUIT, signal.SIGWINCH, signal.SIGTSTP, signal.SIGCONT}

    def forward(signum, _frame) -> None:
        if signum not in (signal.SIGWINCH, signal.SIGCONT, signal.SIGTSTP):
            forwarded.append(signum)
        try:  # SIGSTOP for SIGTSTP: the child's group may be orphaned, and an orphaned group drops SIGTSTP
            sent = signal.SIGSTOP if signum == signal.SIGTSTP else signum
            os.killpg(pid, sent) if signum in to_group else os.kill(pid, sent)
        except ProcessLookupError:
            pass
        if signum == signal.SIGTSTP:
            os.kill(os.getpid(), signal.SIGSTOP)  # as a stopped job; `fg` sends SIGCONT, which goes on too

    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, *to_group):
        if signal.getsignal(signum) != signal.SIG_IGN:  # one the caller ignores, its command ignores too
            previous[signum] = signal.signal(signum, forward)
    return previous


def _restore(handlers: dict) -> None:
    import signal

    for signum, handler in handlers.items():
        signal.signal(signum, handler)


def _wait_exit(conn, forwarded: list[int], previous: dict) -> int:
    """The child's exit status. A child that died of a signal (it said so, or ended without a word after one
    was forwarded) makes this process die of it too, as the command's own process would have."""
    try:
        code = _read_int(conn, EXIT)
    except OSError:
        code = None
    _restore(previous)
    if code is not None and code >= 0:
        return code
    if code is not None or forwarded:
        return _die_of(-code if code is not None else forwarded[-1])
    sys.stderr.write(NO_STATUS)
    return 1


def _die_of(signum: int) -> int:
    import signal

    _flush_std()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return 128 + signum  # a signal whose default is not to end the process


# The server: its own process, started by start_server.

def serve(told: str, run_here) -> None:
    """Own the socket `told` names, import every command's modules, and fork a child for each caller of this
    context until idle or displaced; a child runs its caller's command with run_here (the entry's: the
    command in sys.argv, in this process)."""
    import gc
    import json
    import socket
    import time

    orders = json.loads(told)
    path = orders["socket"]
    if orders["package"] != PACKAGE:
        return  # the search path found another runner than the caller's: serve nothing
    own_context = _context("self")
    idle_s = _idle_s()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    own = _claim(listener, path)  # first: a command meanwhile waits for this server, never starts another
    if own is None or own_context is None:
        return
    _warm()
    gc.freeze()  # what the children share stays shared: the collector does not walk or write it
    listener.settimeout(1.0)
    last, children = time.monotonic(), set[int]()
    try:
        while _still(path, own):
            running = len(children)
            _reap(children)
            if children or len(children) < running:  # idle counts from the last command's end
                last = time.monotonic()
            elif time.monotonic() - last >= idle_s:
                break
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            last = time.monotonic()
            peer_pid, peer_uid = _peer(conn)
            if peer_uid != os.getuid():
                conn.close()
                continue
            child = os.fork()
            if child == 0:
                try:  # whatever happens in the child, it never returns into this loop
                    listener.close()
                    if _context(str(peer_pid)) == own_context:  # a caller of another context: nothing runs
                        _child(conn, run_here)
                finally:
                    os._exit(0)
            children.add(child)
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
    """Bind under a private name, then link it to `path` unless a live server has it: the socket's inode
    (None: another server has the path, or took it meanwhile)."""
    import socket

    private = f"{path}.{os.getpid()}"
    listener.bind(private)
    listener.listen(64)
    inode = os.lstat(private).st_ino
    try:
        os.link(private, path)
    except FileExistsError:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.replace(private, path)  # a dead server's socket
        except OSError:  # alive, its backlog full (EAGAIN): it stays the server
            os.unlink(private)
            return None
        else:
            os.unlink(private)
            return None
        finally:
            probe.close()
    else:
        os.unlink(private)
    return inode if _still(path, inode) else None


def _still(path: str, inode: int) -> bool:
    try:
        return os.lstat(path).st_ino == inode
    except OSError:
        return False


def _reap(children: set[int]) -> None:
    """The children that ended, reaped and taken out of `children`."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        children.discard(pid)


def _child(conn, run_here) -> None:
    """Take the caller's process state, run its command as `runner` would, and send its exit status (-N: it
    died of signal N). The caller's signals are held until its dispositions are taken."""
    import signal
    import struct

    code, running = 1, None
    try:
        try:
            os.setpgid(0, 0)  # the caller forwards its signals to this group
            _hold_signals()
            conn.sendall(PID + struct.pack("!i", os.getpid()))
            request = _receive(conn)
            if request is None:
                return  # the caller went before saying what to run: nothing ran
            _adopt(request)
            running = _watch_caller(conn)
            code = _run_command(run_here)
        except KeyboardInterrupt:  # before the command began, or past it
            code = -signal.SIGINT
        except BaseException:  # noqa: BLE001 - said on the caller's stderr, as an uncaught error would be
            import traceback

            traceback.print_exc()
        try:
            _finish()
        except KeyboardInterrupt:
            code = -signal.SIGINT
    except BaseException:  # noqa: BLE001 - a signal's exception while a handler printed: the status still goes
        pass
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())  # nothing interrupts the status
    if running is not None:
        running.clear()
    try:
        conn.sendall(EXIT + struct.pack("!i", code))
    except OSError:
        pass


def _handed_signals():
    """The signals whose disposition a caller hands on: those it may ignore or Python sets at its start."""
    import signal

    return (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE, signal.SIGXFSZ,
            signal.SIGUSR1, signal.SIGUSR2, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGALRM,
            signal.SIGWINCH, signal.SIGCONT)


def _hold_signals() -> None:
    """Until the caller's dispositions are taken, what it forwards waits: blocked, and not ignored (an ignored
    signal is dropped, and the server may have been started by a process that ignored SIGINT)."""
    import signal

    signal.pthread_sigmask(signal.SIG_BLOCK, _handed_signals())
    for signum in _handed_signals():
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)


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


def _adopt(request: dict) -> None:
    """The caller's argv, directory, umask, environment (its time zone too), ignored and blocked signals;
    standard streams on its descriptors, made as the interpreter makes them (its encodings: the server's,
    the same by the socket's name)."""
    import io
    import signal
    import time

    ignored = set(request["ignored"])
    for signum in ignored & set(_handed_signals()):
        signal.signal(signum, signal.SIG_IGN)  # a pending one is dropped, as the caller would have
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()
    sys.argv = request["argv"]

    def stream(fd: int, like, line_buffering: bool):
        mode = "r" if fd == 0 else "w"
        raw = io.FileIO(fd, mode, closefd=False)
        unbuffered = like.write_through and fd != 0  # -u / PYTHONUNBUFFERED: the text layer writes to the file
        buffered = raw if unbuffered else io.BufferedReader(raw) if fd == 0 else io.BufferedWriter(raw)
        return io.TextIOWrapper(buffered, encoding=like.encoding, errors=like.errors, newline="\n",
                                line_buffering=line_buffering and not unbuffered, write_through=unbuffered)

    streams = (stream(0, sys.__stdin__, False), stream(1, sys.__stdout__, os.isatty(1)),
               stream(2, sys.__stderr__, True))
    sys.stdin, sys.stdout, sys.stderr = streams
    for name, made in zip(("__stdin__", "__stdout__", "__stderr__"), streams):
        setattr(sys, name, made)
    signal.pthread_sigmask(signal.SIG_SETMASK, request["blocked"])  # one held meanwhile is delivered now


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
    """The command's status: SystemExit's code as the interpreter turns it into one (a message goes to
    stderr, then 1); a KeyboardInterrupt that escapes it ends it as it ends an interpreter (-SIGINT)."""
    import signal

    try:
        run_here()
    except SystemExit as done:
        return _status(done.code)
    except KeyboardInterrupt:
        import traceback

        traceback.print_exc()
        return -signal.SIGINT
    return 0


def _status(code) -> int:
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
    _flush_std()


def _flush_std() -> None:
    for out in (sys.stdout, sys.stderr):
        try:
            out.flush()
        except (OSError, ValueError):  # closed, or a reader gone
            pass
