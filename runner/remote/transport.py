"""How the controller reaches a host: run one argv there, get its exit code and output bytes back, within the
command's Deadline. Three implementations of one small interface (the shape of httpx's transports):

    Transport.run(argv, stdin=b"", deadline=Deadline(S)) -> Completed   (stdin: bytes, or chunks as they come)
    Transport.close()

- `LocalTransport` (`host.address: local`): the same host protocol on this machine, through subprocess.
- `SshTransport`: one SSH connection (fabric for ssh_config aliases, IdentityFile, ProxyJump; paramiko
  underneath), host keys verified against known_hosts, keepalive.
- `OpenSshTransport` (transport_openssh.py; `host.transport: openssh`, or `auto` where a system `ssh` is
  there): the system `ssh` client over one ControlMaster, each call one exec through it.

argv is quoted exactly once (`shlex.join`), so nothing a user wrote reaches a shell unquoted. Every paramiko,
socket and OS error of an SSH call, connecting included, is translated into our tree in one place, `_translated`.
"""
from __future__ import annotations

import base64
import errno
import fcntl
import os
import select
import shlex
import signal
import subprocess
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Protocol, runtime_checkable

from ..deadline import Deadline
from ..errors import AuthFailed, HostKeyError, TransportError
from .answers import MAX_ANSWER_BYTES, oversized

if TYPE_CHECKING:
    import paramiko
    from fabric import Connection

KEEPALIVE_S = 15
# What one call reads of a host: stdout up to an answer's cap (answers.MAX_ANSWER_BYTES) and then no further
# (the call fails), stderr's tail only. A host is not trusted to be small: each byte read is held in memory.
MAX_OUTPUT_BYTES = MAX_ANSWER_BYTES
MAX_STDERR_BYTES = 1 << 20
Input = bytes | Iterable[bytes]  # a call's stdin: its bytes, or chunks made while they are sent (an upload)


def input_chunks(stdin: Input) -> Iterator[bytes]:
    return iter((stdin,) if isinstance(stdin, bytes) else stdin)


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    exit_code: int
    stdout: bytes
    stderr: bytes

    def stderr_tail(self, lines: int = 5) -> str:
        text = self.stderr.decode("utf-8", "replace").strip().splitlines()
        return "\n".join(text[-lines:])


class Transport(Protocol):
    name: str
    reached: bool  # whether a command of this transport may have reached the host (False: none could have)

    def run(self, argv: Sequence[str], *, stdin: Input = b"", deadline: Deadline) -> Completed: ...

    def close(self) -> None: ...


@runtime_checkable
class Streaming(Protocol):
    """A transport that can also stream one call's output as it comes (local and OpenSSH; not paramiko)."""

    def stream(self, argv: Sequence[str], *, deadline: Deadline) -> Stream: ...


class Stream:
    """One command's stdout read as it comes (`readline`, `read`), each read within the command's deadline; `close`
    ends the command (killed if still running) and gives its Completed (stdout: what was left unread)."""

    READ_BYTES = 1 << 20

    def __init__(self, proc: subprocess.Popen, argv: Sequence[str], deadline: Deadline, name: str,
                 completed: Callable[[int, bytes, bytes], Completed] | None = None,
                 timed_out: Callable[[], None] = lambda: None) -> None:
        self.proc, self.argv, self.deadline, self.name = proc, tuple(argv), deadline, name
        self._completed = completed or (lambda code, out, err: Completed(self.argv, code, out, err))
        self._timed_out = timed_out
        self._buffer = bytearray()
        self._eof = False
        self._closed: tuple[int, bytes, bytes] | None = None
        stdin, self._stdout, self._stderr = piped(proc)
        stdin.close()
        widen_pipe(self._stdout.fileno())

    def readline(self, limit: int) -> bytes:
        """The next line with its newline, or what is left at the end of the output; more than `limit` bytes
        without a newline is returned as it is (the caller's checker refuses it)."""
        while b"\n" not in self._buffer and len(self._buffer) <= limit and self._fill():
            pass
        end = self._buffer.find(b"\n")
        return self._take(end + 1 if 0 <= end < limit else min(limit, len(self._buffer)))

    def read(self, size: int) -> bytes:
        """`size` bytes, or fewer at the end of the output."""
        while len(self._buffer) < size and self._fill():
            pass
        return self._take(min(size, len(self._buffer)))

    def finish(self) -> Completed:
        """The command's end once it exits by itself (its exit code, its stderr), never past the deadline."""
        try:
            self.proc.wait(timeout=time_left(self.deadline, self.name))
        except (subprocess.TimeoutExpired, TransportError):
            self._timed_out()
        return self.close()

    def close(self) -> Completed:
        """The command's end, killed when still running (the same answer when called again)."""
        if self._closed is None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            stderr = _read_ready(self._stderr.fileno())
            for pipe in (self._stdout, self._stderr):
                pipe.close()
            self._closed = (self.proc.returncode, bytes(self._buffer), stderr)
        return self._completed(*self._closed)

    def _take(self, size: int) -> bytes:
        taken = bytes(self._buffer[:size])
        del self._buffer[:size]
        return taken

    def _fill(self, size: int = READ_BYTES) -> bool:
        if self._eof:
            return False
        self._wait_readable()
        chunk = os.read(self._stdout.fileno(), size)
        self._eof = not chunk
        self._buffer += chunk
        return bool(chunk)

    def _wait_readable(self) -> None:
        """Until the output has bytes or ended; past the deadline the command is ended and TransportError raised."""
        fd = self._stdout.fileno()
        try:
            while not select.select([fd], [], [], time_left(self.deadline, self.name))[0]:
                pass
        except TransportError:
            self._timed_out()
            raise


def piped(proc: subprocess.Popen) -> tuple[IO[bytes], IO[bytes], IO[bytes]]:
    """The stdin, stdout and stderr of a process started with all three piped (as every process here is)."""
    if proc.stdin is None or proc.stdout is None or proc.stderr is None:
        raise ValueError(f"{proc.args!r} was started without its stdin, stdout and stderr piped")
    return proc.stdin, proc.stdout, proc.stderr


def widen_pipe(fd: int) -> None:
    """A pipe of a megabyte where Linux allows it (64 KiB by default): a log streams in fewer, larger reads."""
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except OSError:
        pass


def _read_ready(fd: int) -> bytes:
    """What a pipe holds now, without waiting for its end: an ssh ControlMaster may hold the write end for as
    long as the remote session lasts."""
    os.set_blocking(fd, False)
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    return b"".join(chunks)


def spawn(command: Sequence[str], who: str) -> subprocess.Popen:
    """A host call's process, its three streams piped, in a session of its own: a terminal's Ctrl-C reaches
    runner alone, which decides (interrupts.py)."""
    try:
        return subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as exc:
        raise TransportError(f"{who}: cannot run {command[0]}: {exc.strerror}") from exc


def interrupted_before_it_ran(returncode: int, name: str) -> None:
    """A host call's process runs in a session of its own, out of a terminal's reach once there: one killed by
    SIGINT got a Ctrl-C meant for runner between its fork and that session, before it ran anything (the
    interrupt is runner's to act on: commands/interrupts.py). Said as a lost link, which an idempotent call
    repeats and a submit asks about before submitting again."""
    if returncode == -signal.SIGINT:
        raise TransportError(f"{name}: the call was interrupted (SIGINT) before it started")


class LocalTransport:
    name = "local"
    reached = True

    def stream(self, argv: Sequence[str], *, deadline: Deadline) -> Stream:
        return Stream(spawn(argv, "local"), argv, deadline, self.name)

    def run(self, argv: Sequence[str], *, stdin: Input = b"", deadline: Deadline) -> Completed:
        timeout = deadline.left()
        try:
            # its own session, as spawn's
            proc = subprocess.run(list(argv), input=b"".join(input_chunks(stdin)), capture_output=True, timeout=timeout,
                                  start_new_session=True)
        except subprocess.TimeoutExpired as exc:
            raise TransportError(f"local: {argv[0]} did not answer within {timeout:.0f} s") from exc
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.EACCES, errno.ENOEXEC):  # what a shell answers: 127 / 126
                why = "not found" if exc.errno == errno.ENOENT else exc.strerror
                return Completed(tuple(argv), 127 if exc.errno == errno.ENOENT else 126, b"",
                                 f"{argv[0]}: {why}".encode())
            raise TransportError(f"local: cannot run {argv[0]}: {exc.strerror}") from exc
        interrupted_before_it_ran(proc.returncode, "local")
        return Completed(tuple(argv), proc.returncode, proc.stdout, proc.stderr)

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class SshTarget:
    address: str
    user: str | None = None
    port: int | None = None
    host_key_policy: str = "strict"
    connect_timeout: float = 10.0
    ssh_config: str | None = None  # default: ~/.ssh/config; RUNNER_SSH_CONFIG overrides


class SshTransport:
    """One lazily opened SSH connection, reused for every call of one controller command."""

    def __init__(self, target: SshTarget) -> None:
        self.target = target
        self.name = target.address
        self._conn: Connection | None = None
        self._connecting = ConnectBudget(target)
        self.reached = False

    def run(self, argv: Sequence[str], *, stdin: Input = b"", deadline: Deadline) -> Completed:
        conn = self._conn
        connecting = conn is None
        try:
            if conn is None:
                conn = self._conn = _connect(self.target, self._connecting.take(deadline).left())
                self._connecting.reset()  # connected: a reconnect after a lost link has a connect_timeout of its own
            self.reached = True
            return _exec(conn.transport, tuple(argv), stdin, deadline, self.name)  # paramiko's connection
        except TransportError:
            self.close()
            raise
        except _ssh_errors() as exc:
            self.close()
            raise _translated(exc, self.target, connecting) from exc

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


def _paramiko() -> ModuleType:
    import paramiko  # imported lazily: `address: local` never needs it

    return paramiko


def _ssh_errors() -> tuple[type[BaseException], ...]:
    """What an SSH call can raise besides our own errors: paramiko's, the socket's, the files' (OSError)."""
    paramiko = _paramiko()
    return (OSError, EOFError, paramiko.SSHException, paramiko.hostkeys.InvalidHostKey)


def _translated(exc: BaseException, target: SshTarget, connecting: bool) -> TransportError:
    """The one translation of a paramiko/socket/OS error into our tree (exit 3), with what to check next."""
    paramiko = _paramiko()
    name = target.address
    if isinstance(exc, paramiko.BadHostKeyException):
        # `ssh-keygen -R` needs the known_hosts name (`[host]:port` off port 22), not the ssh_config alias.
        return HostKeyError(
            f"ssh {name}: the host key CHANGED: got {exc.key.get_name()} {fingerprint(exc.key)}, "
            f"known_hosts has {fingerprint(exc.expected_key)}",
            hint="If the host was legitimately reinstalled, remove the old line with "
            f"`ssh-keygen -R {shlex.quote(_known_hosts_name(exc.hostname or name, target.port))}`; "
            "otherwise do not connect.")
    if isinstance(exc, paramiko.AuthenticationException):
        return AuthFailed(f"ssh {name}: authentication failed as {target.user or 'the ssh_config user'}",
                          hint=auth_hint(target))
    if isinstance(exc, paramiko.hostkeys.InvalidHostKey):
        return HostKeyError(f"ssh {name}: a known_hosts line cannot be read: {exc.line[:100]!r}",
                            hint="Fix or remove that line (`ssh-keygen -F HOST` shows the lines for a host).")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):  # its own text is `[Errno None] …`
        tried = "; ".join(f"{host} port {port}: {why.strerror or why}" for (host, port, *_), why in exc.errors.items())
        return TransportError(f"ssh {name}: cannot connect ({tried})",
                              hint="Check that `ssh` itself reaches the host (address, port, network) and that "
                                   f"sshd listens there; {port_decided_by(target)}.")
    verb = "cannot connect" if connecting else "connection lost"
    return TransportError(f"ssh {name}: {verb} ({_describe(exc)})",
                          hint=f"Check that `ssh` itself reaches the host; {port_decided_by(target)}." if connecting
                          else "")


def port_decided_by(target: SshTarget) -> str:
    """Which setting chose the port a failed connect used: the spec's host.port overrides ssh_config's Port."""
    if target.port:
        return f"the port {target.port} is host.port in the job spec (it overrides ssh_config's Port: leave it " \
               "out to use ssh_config's)"
    return "the port is ssh_config's Port for this host (22 when it sets none)"


def auth_hint(target: SshTarget) -> str:
    """What to check after a refused login, naming the setting that chose the user (host.user overrides
    ssh_config's User)."""
    if target.user:
        user = f"the user {target.user} is host.user in the job spec (it overrides ssh_config's User: leave it " \
               "out to use ssh_config's)"
    else:
        user = "the user is ssh_config's User for this host (your own name when it sets none)"
    return f"Check the user and IdentityFile (ssh_config) and that `ssh` itself can log in; {user}."


def _known_hosts_name(host: str, port: int | None) -> str:
    return host if not port or port == 22 else f"[{host}]:{port}"


def _connect(target: SshTarget, timeout: float) -> Connection:
    """Open a fabric Connection with our host-key rules; `timeout` (what is left for connecting) bounds the TCP
    connect, the banner and key exchange, the authentication and the channels. Errors are translated by the
    caller (`run`)."""
    conn = _fabric_connection(target, timeout)
    try:
        _open_gateway(conn.gateway, target, timeout)
        conn.open()
    except BaseException:
        conn.close()
        raise
    conn.transport.set_keepalive(KEEPALIVE_S)
    import socket  # here: the OpenSSH transport never needs it, and `runner` starts without it

    sock = conn.transport.sock
    if isinstance(sock, socket.socket):
        # Without it, each new channel on the connection waits ~40 ms for the server's delayed ACK (Nagle).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _open_gateway(gateway: Connection | str | None, target: SshTarget, timeout: float) -> None:
    """Open a ProxyJump hop before the target (fabric would open it inside the target's connect): its errors
    then name the jump host, and the direct-tcpip channel through it waits at most `timeout` (paramiko's
    default is 3600 s: a dead target behind a live jump host held `tail --max-wait 10` for ~130 s). fabric
    builds the hop with no timeouts (a dead jump host would block for the kernel's TCP timeout) and, as for
    the target, no known_hosts: both are set here first."""
    if gateway is None or isinstance(gateway, str):
        return
    _open_gateway(gateway.gateway, target, timeout)
    hop = SshTarget(address=gateway.host, user=gateway.user, port=gateway.port,
                    host_key_policy=target.host_key_policy, connect_timeout=timeout)
    _bound(gateway, timeout, target.host_key_policy)
    try:
        gateway.open()
    except TransportError as exc:
        raise type(exc)(f"{exc} (the jump host on the way to {target.address})", hint=exc.hint) from exc
    except _ssh_errors() as exc:
        error = _translated(exc, hop, True)
        raise type(error)(f"{error} (the jump host on the way to {target.address})", hint=error.hint) from exc
    gateway.transport.channel_timeout = timeout


def _fabric_connection(target: SshTarget, timeout: float) -> Connection:
    import logging

    from fabric import Config, Connection

    # paramiko logs a failed handshake with a traceback through logging's last-resort handler; the error
    # itself reaches cli.main as an exception and is reported once there.
    logging.getLogger("paramiko").addHandler(logging.NullHandler())

    config_path = target.ssh_config or os.environ.get("RUNNER_SSH_CONFIG")
    config = Config(runtime_ssh_path=config_path) if config_path else Config()
    kwargs = {"config": config}
    if target.user:
        kwargs["user"] = target.user
    if target.port:
        kwargs["port"] = target.port
    conn = Connection(target.address, **kwargs)
    _bound(conn, timeout, target.host_key_policy)
    return conn


def _bound(conn: Connection, timeout: float, policy: str) -> None:
    """`timeout` on every step of connecting, and fabric's AutoAddPolicy undone: known_hosts loaded (fabric
    loads none and accepts every key), an unknown key refused (or, opt-in, recorded)."""
    conn.connect_timeout = timeout
    conn.connect_kwargs.update(banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout)
    files = known_hosts_files(conn.ssh_config)
    skipped = 0
    for path in files:
        if path.exists():
            skipped += load_known_hosts(conn.client.get_host_keys(), path)
    conn.client.set_missing_host_key_policy(_MissingKeyPolicy(policy, files[0], ca_lines=skipped))


def load_known_hosts(keys: paramiko.HostKeys, path: Path) -> int:
    """paramiko's HostKeys.load, but knowing OpenSSH's markers, which paramiko cannot parse.

    `@cert-authority` lines are skipped: paramiko cannot check host certificates, so they trust nothing here
    and a host known only through its CA stays unknown (refused, the message naming the marker). `@revoked`
    refuses to go on: ignoring a revocation would trust a key the user revoked. Returns how many
    `@cert-authority` lines were skipped.
    """
    from paramiko.hostkeys import HostKeyEntry

    ca_lines = 0
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        line = line.strip()
        ca_lines += line.startswith("@cert-authority ")
        if not line or line.startswith(("#", "@cert-authority ")):
            continue
        if line.startswith("@"):
            raise HostKeyError(f"{path}:{number}: `{line.split()[0]}` lines cannot be honoured by the "
                               f"paramiko SSH transport", hint="Remove the line, or reach this host with `ssh`.")
        try:
            entry = HostKeyEntry.from_line(line, number)
        except _paramiko().SSHException:
            continue  # a key type paramiko does not know, as HostKeys.load does
        if entry is None:
            continue
        for hostname in entry.hostnames:
            keys.add(hostname, entry.key.get_name(), entry.key)
    return ca_lines


def known_hosts_files(ssh_config: dict) -> list[Path]:
    """UserKnownHostsFile entries from ssh_config (space separated, `~` expanded), else the defaults."""
    configured = ssh_config.get("userknownhostsfile")
    if configured:
        return [Path(os.path.expanduser(p)) for p in configured.split()]
    return [Path.home() / ".ssh" / "known_hosts", Path("/etc/ssh/ssh_known_hosts")]


@dataclass(frozen=True)
class _MissingKeyPolicy:
    policy: str
    record_in: Path
    ca_lines: int = 0

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if self.policy != "accept-new":
            raise HostKeyError(
                f"ssh {hostname}: host key not in known_hosts: {key.get_name()} {fingerprint(key)}"
                + (f" (known_hosts has {self.ca_lines} `@cert-authority` line(s): host certificates cannot be "
                   "checked by the paramiko transport; `host.transport: openssh` checks them)" if self.ca_lines else ""),
                hint="Verify the fingerprint out of band, then add it (`ssh-keyscan` or one `ssh` login), "
                "or set `host.host_key_policy: accept-new` to trust it on first use.",
            )
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.record_in.parent.mkdir(parents=True, exist_ok=True)
        with open(self.record_in, "a", encoding="ascii") as fh:
            fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def fingerprint(key: paramiko.PKey) -> str:
    import hashlib  # the paramiko transport's: an OpenSSH command never needs it

    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def _exec(connection: paramiko.Transport, argv: tuple[str, ...], stdin: Input, deadline: Deadline,
          name: str) -> Completed:
    """Run one command on its own channel; read both streams until exit, never past the deadline."""
    chan = connection.open_session(timeout=time_left(deadline, name))
    try:
        chan.settimeout(time_left(deadline, name))
        chan.exec_command(shlex.join(argv))
        for chunk in input_chunks(stdin):
            chan.sendall(chunk)
        chan.shutdown_write()
        out, err = _drain(chan, deadline, name)
        return Completed(argv, chan.recv_exit_status(), out, err)
    finally:
        chan.close()


def _drain(chan: paramiko.Channel, deadline: Deadline, name: str) -> tuple[bytes, bytes]:
    """Both streams until the command exits: stdout never past MAX_OUTPUT_BYTES (BadAnswer, the channel closed
    by the caller), stderr's last MAX_STDERR_BYTES."""
    out, err = bytearray(), bytearray()
    while True:
        while chan.recv_ready():
            out += chan.recv(1 << 16)
            if len(out) > MAX_OUTPUT_BYTES:
                raise oversized(name)
        while chan.recv_stderr_ready():
            keep_tail(err, chan.recv_stderr(1 << 16))
        if chan.exit_status_ready() and chan.eof_received and not (chan.recv_ready() or chan.recv_stderr_ready()):
            return bytes(out), bytes(err)
        if chan.closed and not (chan.recv_ready() or chan.recv_stderr_ready()):
            raise TransportError(f"ssh {name}: channel closed before the command finished")
        select.select([chan], [], [], min(0.05, time_left(deadline, name)))


def keep_tail(err: bytearray, chunk: bytes) -> None:
    """Add chunk to a stderr read so far, keeping about its last MAX_STDERR_BYTES (what a message quotes is its
    last lines); trimmed once it holds twice that, not copied at every chunk."""
    err += chunk
    if len(err) > 2 * MAX_STDERR_BYTES:
        del err[:-MAX_STDERR_BYTES]


def time_left(deadline: Deadline, name: str) -> float:
    """Seconds the command's deadline leaves for a hop to host `name`; none left is a TransportError."""
    left = deadline.left()
    if left <= 0:
        raise TransportError(f"ssh {name}: no answer before the deadline (link down or host overloaded?)")
    return left


class ConnectBudget:
    """What host.connect_timeout leaves: every connect attempt of one command until one connects shares it (a
    host that never answers is not waited for again by a retry); `reset` once connected, or once an attempt
    failed fast, so a later connect has a connect_timeout of its own."""

    def __init__(self, target: SshTarget) -> None:
        self.name, self.timeout = target.address, target.connect_timeout
        self._by: Deadline | None = None

    def take(self, deadline: Deadline) -> Deadline:
        time_left(deadline, self.name)  # the command's deadline first: it is what ended the wait, if it passed
        if self._by is None:
            self._by = deadline.within(self.timeout)
        if self._by.passed():
            raise TransportError(f"ssh {self.name}: cannot connect (no answer within host.connect_timeout, "
                                 f"{self.timeout:g} s)",
                                 hint="Check that `ssh` itself reaches the host (address, port, network).")
        return self._by

    def reset(self) -> None:
        self._by = None


def _describe(exc: BaseException) -> str:
    # socket.timeout is TimeoutError since Python 3.10
    return "timed out" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
