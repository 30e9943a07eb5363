"""The OpenSSH transport: the user's own `ssh` client runs each command, so every ssh_config option they use
(ProxyJump, certificates, agents, FIDO keys, GSSAPI, Match blocks, their own ControlMaster) works as in a shell.

    ssh [-F CONFIG] -o BatchMode=yes -o StrictHostKeyChecking=yes|accept-new -o ConnectTimeout=N -o ServerAlive…
        [-o ControlMaster=auto -o ControlPath=SHORT/TAG/%C -o ControlPersist=120] [-l USER] [-p PORT] -- HOST CMD

One master connection per host is kept (unless the user's config names a ControlPath of its own), so a warm
command is one exec on an open connection. Its socket is in SHORT ($XDG_RUNTIME_DIR/runner-cm, else
/tmp/runner-cm-UID: a path short enough for a Unix socket whatever TMPDIR and the state dir are), in TAG: a
hash of the state dir and of the known_hosts files as they are now, so a changed known_hosts never rides on a
master verified under the old one, nor does one state dir use another's. Host keys are checked by OpenSSH itself (strict
unless the spec opts in to accept-new). Exit 255 is ssh's own failure: its stderr is mapped into our tree
(`HostKeyError` naming the host whose key failed, with the fingerprint line ssh printed; auth; unreachable),
all exit 3. Each call is bounded by the command's Deadline: ConnectTimeout and the keepalives come from what
is left of it (and of host.connect_timeout, shared by every connect attempt of the command), and the process
is killed when it passes.

`for_host(host)` picks the transport a spec's `host.transport` asks for (`auto`: this one when `ssh` exists).
"""
from __future__ import annotations

import binascii
import json
import os
import re
import selectors
import shlex
import subprocess
import time
from collections.abc import Sequence, Set
from pathlib import Path
from typing import IO

from .. import verbose
from ..deadline import Deadline
from ..errors import AuthFailed, HostKeyError, SpecError, TransportError
from .answers import oversized
from .transport import (
    MAX_OUTPUT_BYTES,
    Completed,
    ConnectBudget,
    Input,
    LocalTransport,
    SshTarget,
    SshTransport,
    Stream,
    Transport,
    auth_hint,
    input_chunks,
    interrupted_before_it_ran,
    keep_tail,
    piped,
    port_decided_by,
    spawn,
    time_left,
    widen_pipe,
)

EXIT_SSH_FAILED = 255
SERVER_ALIVE_S = 15  # the keepalive interval when the command has time; less when it has less
SERVER_ALIVE_COUNT = 3
CONTROL_PERSIST_S = 120
# sun_path holds 104 bytes on macOS (108 on Linux); ssh appends ".XXXXXXXXXXXXXXXX" while it binds a new master.
SOCKET_PATH_MAX = 104 - 1 - 17
CONTROL_NAME_LEN = 40  # %C: a SHA1 of local host, remote host, port, user
CONTROL_TAG_LEN = 12  # the hash naming one state dir's masters for one trust tag


class OpenSshTransport:
    """Runs each command with the system `ssh`; the connection lives in a ControlMaster between commands."""

    def __init__(self, target: SshTarget, *, state: Path, ssh: str = "ssh") -> None:
        self.target = target
        self.name = target.address
        self.control_dir = state / "cm"
        self.cache_dir = state / "ssh"  # where `ssh -G`'s answer is kept between commands
        self.ssh = ssh
        self._options: list[str] | None = None
        self._resolved: dict[str, str] = {}  # `ssh -G` of the target: hostname, port, controlpath…
        # What cache_dir holds for this target: key, at, resolved, and trust: [the known_hosts stamp, the sockets'
        # dir made for it, the control dir it was made under]
        self._record: dict = {}
        self._connecting = ConnectBudget(target)
        self.reached = False

    def run(self, argv: Sequence[str], *, stdin: Input = b"", deadline: Deadline) -> Completed:
        return self.start(argv, deadline=deadline).finish(stdin)

    def start(self, argv: Sequence[str], *, deadline: Deadline) -> Running:
        """The command started with its stdin still open: `finish(stdin)` gives it its input and waits."""
        connecting = self._connecting.take(deadline)
        command = self.command(shlex.join(argv), deadline, connecting)
        time_left(deadline, self.name)  # none left: a TransportError, before anything starts
        verbose.say(shlex.join(command))
        return Running(self, tuple(argv), command, spawn(command, f"ssh {self.name}"), deadline)

    def stream(self, argv: Sequence[str], *, deadline: Deadline) -> Stream:
        """The command started with no input, its stdout read as it comes (transport.Stream); ssh's own
        failure (exit 255) is raised by `close`, as `run` raises it."""
        running = self.start(argv, deadline=deadline)
        return Stream(running.proc, argv, deadline, self.name,
                      lambda code, out, err: self._completed(running, code, out, err), self._drop_master)

    def _completed(self, running: Running, returncode: int, stdout: bytes, stderr_bytes: bytes) -> Completed:
        interrupted_before_it_ran(returncode, f"ssh {self.name}")
        stderr = stderr_bytes.decode("utf-8", "replace") if returncode == EXIT_SSH_FAILED else ""
        if not _CONNECT_TIMED_OUT.search(stderr):
            self._connecting.reset()  # it connected (or failed fast)
        if returncode != EXIT_SSH_FAILED or not never_ran(stderr):
            self.reached = True
        if returncode == EXIT_SSH_FAILED:
            if self._says_too_little(stderr):
                stderr = self._diagnosed(running.command, running.deadline) or stderr
            raise translated(stderr, self.target, self._known_as())
        return Completed(running.argv, returncode, stdout, stderr_bytes)

    def _drop_master(self) -> None:
        """Close the master after a call ran out of time: its TCP connection may be stalled in retransmit
        back-off long after the link returns; the next command then connects afresh. `-O exit` talks to the
        local socket only; it is not waited for, the command's deadline having passed already."""
        if self._options is None or "ControlMaster=auto" not in self._options:
            return
        try:
            subprocess.Popen([self.ssh, *self._options, "-O", "exit", "--", self.target.address],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            pass

    def _says_too_little(self, stderr: str) -> bool:
        """A refused key without its fingerprint (strict checking does not print an unknown key's), or a
        jump host's failure hidden: with ControlPersist, ssh sends the ProxyJump hop's stderr to /dev/null."""
        if is_host_key_failure(stderr):
            return not _FINGERPRINT.search(stderr)
        through_jump = self._resolved.get("proxyjump", "none") != "none" or \
            self._resolved.get("proxycommand", "none") != "none"
        return through_jump and "Permission denied" not in stderr

    def _diagnosed(self, command: list[str], deadline: Deadline) -> str:
        """ssh's stderr once more with -v (the hops' stderr kept, `Server host key|certificate: TYPE SHA256:…`),
        debug lines but that one dropped. A key problem fails again before any authentication."""
        try:
            proc = subprocess.run([command[0], "-v", *command[1:-1], "true"], capture_output=True,
                                  stdin=subprocess.DEVNULL, timeout=time_left(deadline, self.name))
        except (OSError, subprocess.TimeoutExpired, TransportError):
            return ""
        lines = proc.stderr.decode("utf-8", "replace").splitlines()
        return "\n".join(line.split("debug1: ", 1)[-1] for line in lines
                         if not line.startswith("debug") or "Server host key:" in line
                         or "Server host certificate:" in line)

    def command(self, remote: str, deadline: Deadline, connecting: Deadline | None = None) -> list[str]:
        """The ssh argv for one remote command line (already quoted once). Its timeouts come from what is
        left: ConnectTimeout (TCP, banner and key exchange) from `connecting` (default: the deadline), and
        keepalives that give up on a silent link within what is left of the command."""
        if self._options is None:
            self._options = self._fixed_options(deadline)
        connect = _whole_seconds((connecting or deadline).left())
        alive = min(SERVER_ALIVE_S, _whole_seconds(deadline.left() / SERVER_ALIVE_COUNT))
        return [self.ssh, *self._options, "-o", f"ConnectTimeout={connect}", "-o", f"ServerAliveInterval={alive}",
                "-o", f"ServerAliveCountMax={SERVER_ALIVE_COUNT}", "--", self.target.address, remote]

    def _known_as(self) -> set[str]:
        """The names the target's own key line has in known_hosts (any other host's key is a jump host's)."""
        host, port = self._resolved.get("hostname", self.target.address), self._resolved.get("port", "22")
        return {self.target.address, host if port == "22" else f"[{host}]:{port}"}

    def close(self) -> None:
        """Nothing to close: the master connection outlives the command on purpose (ControlPersist)."""

    def _fixed_options(self, deadline: Deadline) -> list[str]:
        target = self.target
        config = target.ssh_config or os.environ.get("RUNNER_SSH_CONFIG")
        options = ["-F", config] if config else []
        checking = "accept-new" if target.host_key_policy == "accept-new" else "yes"
        options += ["-T", "-o", "BatchMode=yes", "-o", f"StrictHostKeyChecking={checking}"]
        if target.user:
            options += ["-l", target.user]
        if target.port:
            options += ["-p", str(target.port)]
        self._resolved = self._ssh_g(options, deadline)
        if self._resolved.get("controlpath", "none") in ("", "none"):  # the user's ssh_config names none of its own
            try:
                socket_dir = self._socket_dir()
            except OSError:  # a state dir that cannot be written: each call connects afresh, nothing else changes
                return options
            options += ["-o", "ControlMaster=auto", "-o", f"ControlPath={socket_dir}/%C",
                        "-o", f"ControlPersist={CONTROL_PERSIST_S}"]
        return options

    def _ssh_g(self, options: list[str], deadline: Deadline) -> dict[str, str]:
        """The user's ssh_config as applied to this host (`ssh -G`, no network): {option: value}. Asked once
        per SSH_G_TTL_S while the config files stay as they were, the answer kept in the process (a fleet's
        driver connects to each host for every poll) and in cache_dir (each CLI command is a new process);
        the trust tag is still taken from the known_hosts files at each connect."""
        argv = [self.ssh, *options, "-G", "--", self.target.address]
        configs = [options[1]] if options[:1] == ["-F"] else ["~/.ssh/config", "/etc/ssh/ssh_config"]
        key, now = json.dumps([*argv, *map(_file_stamp, configs)]), time.time()
        known = _SSH_G.get(key) or self._recorded(key)
        if known is not None and 0 <= now - known["at"] < SSH_G_TTL_S:
            self._record = known
            return dict(known["resolved"])
        try:
            proc = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL,
                                  timeout=time_left(deadline, self.name))
        except (OSError, subprocess.TimeoutExpired, TransportError):
            return {}
        resolved = parse_ssh_g(proc.stdout.decode("utf-8", "replace"))
        if proc.returncode == 0 and resolved:
            self._record = {"key": key, "at": now, "resolved": resolved, "trust": (known or {}).get("trust")}
            _SSH_G[key] = self._record
            self._save_record()
        return dict(resolved)

    def _socket_dir(self) -> Path:
        """The control sockets' dir: control_socket_dir of the trust tag, remembered beside `ssh -G`'s answer
        with the known_hosts stamp it was made from. The same stamp (and sockets' home) makes the same dir, not
        hashed again; a changed known_hosts is hashed afresh (a new master)."""
        from ..state.store import private_dir

        stamp, control_dir, home = trust_stamp(self._resolved), str(self.control_dir), sockets_home()
        remembered = self._record.get("trust")
        if isinstance(remembered, list) and len(remembered) == 3 and remembered[0] == stamp \
                and remembered[2] == control_dir and isinstance(remembered[1], str) \
                and Path(remembered[1]).parent == home:
            return private_dir(Path(remembered[1]))
        socket_dir = control_socket_dir(self.control_dir / trust_tag(self._resolved), home)
        if self._record:
            self._record["trust"] = [stamp, str(socket_dir), control_dir]
            self._save_record()
        return socket_dir

    def _record_path(self, key: str) -> Path:
        return self.cache_dir / f"ssh-G-{binascii.crc32(key.encode()):08x}.json"  # its key is checked on reading

    def _recorded(self, key: str) -> dict | None:
        """cache_dir's answer for this `ssh -G` argv and config files, or None (none, another key's, unreadable)."""
        from ..state.store import read_cache

        record = read_cache(self._record_path(key))
        if not (record is not None and record.get("key") == key and isinstance(record.get("at"), float)
                and isinstance(record.get("resolved"), dict)):
            return None
        _SSH_G[key] = record
        return record

    def _save_record(self) -> None:
        """Best effort (write_cache): a state dir that cannot be written only costs the next command an `ssh -G`."""
        from ..state.store import write_cache

        write_cache(self._record_path(self._record["key"]), json.dumps(self._record))


def _file_stamp(path: str) -> tuple:
    """(path, inode, size, mtime), or (path,) when it cannot be stat'ed."""
    try:
        st = os.stat(os.path.expanduser(path))
    except OSError:
        return (path,)
    return (path, st.st_ino, st.st_size, st.st_mtime_ns)


SSH_G_TTL_S = 60.0
_SSH_G: dict[str, dict] = {}  # `ssh -G` argv and config stamps: {key, at (time.time()), resolved, trust}


def parse_ssh_g(text: str) -> dict[str, str]:
    pairs = (line.partition(" ") for line in text.splitlines())
    return {key: value.strip() for key, _, value in pairs if key}


def trust_stamp(resolved: dict[str, str]) -> str:
    """What a master connection was made with: the host's effective settings (`ssh -G`: identity files and
    agent, user, port, proxy, certificates… all of them), and the known_hosts files it is verified against, as
    they are now: each path with its inode, size and mtime (or `absent`). Two aliases of one host whose settings
    differ (another IdentityFile) never share a master: `%C` alone names only the host, port and user."""
    lines = ["settings " + json.dumps(sorted(resolved.items())) + "\n"]
    for option in ("userknownhostsfile", "globalknownhostsfile", "stricthostkeychecking"):
        for word in resolved.get(option, "").split():
            stamp = _file_stamp(os.path.expanduser(word))
            lines.append("|".join(map(str, stamp)) + ("|absent\n" if len(stamp) == 1 else "\n"))
    return "".join(lines)


def trust_tag(resolved: dict[str, str]) -> str:
    """The trust stamp's hash, naming a master's socket dir. A master connection is not checked again when
    reused, so other settings (a wrong key: its login must fail) or a known_hosts that changed (a key removed or
    replaced) get a new master, made and verified afresh, instead of riding on one made under the old ones."""
    import hashlib  # OpenSSL's start: a command whose trust stamp is remembered never loads it

    return hashlib.sha256(trust_stamp(resolved).encode()).hexdigest()[:10]


def control_socket_dir(masters: Path, home: Path) -> Path:
    """The dir of the control sockets of `masters` (a state dir's, for one trust tag): named by its hash in
    `home` (sockets_home), so that a socket's path has one short length whatever the state dir and TMPDIR are."""
    import hashlib

    from ..state.store import private_dir

    return private_dir(home / hashlib.sha256(str(masters).encode()).hexdigest()[:CONTROL_TAG_LEN])


def sockets_home() -> Path:
    """$XDG_RUNTIME_DIR/runner-cm where that path is short enough, else /tmp/runner-cm-UID (never TMPDIR, which
    can be long: macOS's alone is ~49 characters); made 0700, and used only when it is this user's own dir
    with no access for others (OSError: then each call connects afresh)."""
    import stat

    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    home = Path(runtime, "runner-cm") if runtime.startswith("/") else Path("/tmp", f"runner-cm-{os.getuid()}")
    if len(os.fsencode(str(home))) + 2 + CONTROL_TAG_LEN + CONTROL_NAME_LEN > SOCKET_PATH_MAX:
        home = Path("/tmp", f"runner-cm-{os.getuid()}")
    try:
        home.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(home)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise PermissionError(f"{home} is not a dir of this user's")
    if st.st_mode & 0o077:
        os.chmod(home, 0o700)
    return home


# What OpenSSH prints when it refuses a host key, and the line naming that host (the jump host when it is
# the jump host's key: the hop's own ssh prints it).
_HOST_KEY_MARKS = ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED",
                   "host key is known for", "Certificate invalid", "No matching host key")
_KEY_HOST = re.compile(r"(?:Host key for|host key is known for) (\S+) (?:has changed|and you have)")
_FINGERPRINT = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")


class Running:
    """One ssh command under way (OpenSshTransport.start), given its stdin once."""

    def __init__(self, transport: OpenSshTransport, argv: tuple, command: list[str], proc: subprocess.Popen,
                 deadline: Deadline) -> None:
        self.transport, self.argv, self.command, self.proc, self.deadline = transport, argv, command, proc, deadline

    def finish(self, stdin: Input) -> Completed:
        """Send stdin, close it, wait for the command (never past the deadline: then it is killed)."""
        name = self.transport.name
        try:
            time_left(self.deadline, name)  # passed before the input was ready: a TransportError
            stdout, stderr = exchange(self.proc, stdin, self.deadline, name)
        except subprocess.TimeoutExpired as exc:
            self.transport.reached = True  # its input was sent: the host may have acted on it
            self._kill()
            self.transport._drop_master()
            raise TransportError(f"ssh {name}: no answer before the deadline (link down or host overloaded?)") from exc
        except Exception:  # a TransportError, an answer past the cap (BadAnswer), or the input's own failure
            self._kill()
            raise
        return self.transport._completed(self, self.proc.returncode, stdout, stderr)

    def _kill(self) -> None:
        """Close our ends (stdin's EOF reaches the remote side) and kill the client, without waiting for its
        output: a ControlMaster holds the pipes it was handed for as long as the remote session lasts."""
        for pipe in piped(self.proc):
            pipe.close()
        self.proc.kill()
        self.proc.wait()


def exchange(proc: subprocess.Popen, stdin: Input, deadline: Deadline, name: str) -> tuple[bytes, bytes]:
    """Popen.communicate, but stdin may come in chunks as they are made (an upload), stdout is never read past
    MAX_OUTPUT_BYTES (BadAnswer) and only stderr's last MAX_STDERR_BYTES are kept: a host's answer is held in
    memory, and a host is not trusted to be small. subprocess.TimeoutExpired when the deadline passes."""
    out, err = bytearray(), bytearray()
    to_stdin, stdout, stderr = piped(proc)
    feed = _Feed(to_stdin, stdin)
    with selectors.DefaultSelector() as selector:
        if feed.open:
            selector.register(to_stdin, selectors.EVENT_WRITE)
        selector.register(stdout, selectors.EVENT_READ)
        selector.register(stderr, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline.left()
            if left <= 0:
                raise subprocess.TimeoutExpired(proc.args, 0)
            for key, _ in selector.select(left):
                if key.fileobj is to_stdin:
                    if not feed.write():
                        selector.unregister(to_stdin)
                    continue
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fileobj)
                elif key.fileobj is stdout:
                    out += chunk
                    if len(out) > MAX_OUTPUT_BYTES:
                        raise oversized(name)
                else:
                    keep_tail(err, chunk)
    proc.wait(timeout=max(0.0, deadline.left()))
    return bytes(out), bytes(err)


class _Feed:
    """A command's stdin, written as the pipe takes it (never blocking: the answer is read meanwhile); the pipe
    closed once all is sent or the other end went away."""

    WRITE_BYTES = 1 << 20

    def __init__(self, pipe: IO[bytes], stdin: Input) -> None:
        self.pipe, self.chunks = pipe, input_chunks(stdin)
        self.pending = memoryview(next(self.chunks, b""))
        self.open = bool(self.pending)
        if self.open:
            os.set_blocking(pipe.fileno(), False)
            widen_pipe(pipe.fileno())
        else:
            pipe.close()

    def write(self) -> bool:
        """One write that cannot block; whether there is more to write."""
        try:
            self.pending = self.pending[os.write(self.pipe.fileno(), self.pending[:self.WRITE_BYTES]):]
            while not self.pending:
                chunk = next(self.chunks, None)
                if chunk is None:
                    break
                self.pending = memoryview(chunk)
        except BlockingIOError:
            return True
        except BrokenPipeError:
            self.pending = memoryview(b"")
        if self.pending:
            return True
        self.pipe.close()
        self.open = False
        return False


# ssh's words for a connect that used up ConnectTimeout (TCP, or the banner and key exchange after it), and
# for a connection that was never made (the remote command cannot have run).
_CONNECT_TIMED_OUT = re.compile(r"Connection timed out|timed out during banner exchange")
_NOT_CONNECTED = re.compile(r"Connection refused|Could not resolve hostname|Name or service not known|"
                            r"No route to host|Network is unreachable|" + _CONNECT_TIMED_OUT.pattern)


def never_ran(stderr: str) -> bool:
    """ssh failed before the remote command could start: no connection, a refused host key or login."""
    return bool(_NOT_CONNECTED.search(stderr)) or is_host_key_failure(stderr) or \
        "Permission denied" in stderr or "Too many authentication failures" in stderr


def is_host_key_failure(stderr: str) -> bool:
    return any(mark in stderr for mark in _HOST_KEY_MARKS)


def translated(stderr: str, target: SshTarget, known_as: Set[str] = frozenset()) -> TransportError:
    """ssh's exit 255 and its stderr as our error (all exit 3), naming what to check next."""
    name = target.address
    tail = "\n".join(line for line in stderr.strip().splitlines()[-6:] if line.strip())
    if is_host_key_failure(stderr):
        return _host_key_error(stderr, name, target.host_key_policy, known_as | {name})
    if "Permission denied" in stderr or "Too many authentication failures" in stderr:
        return AuthFailed(f"ssh {name}: authentication failed: {tail}", hint=auth_hint(target))
    return TransportError(f"ssh {name}: cannot connect: {tail or 'ssh exited 255 and printed nothing'}",
                          hint="Check that `ssh` itself reaches the host (address, ProxyJump, network); "
                               f"{port_decided_by(target)}.")


def _host_key_error(stderr: str, name: str, policy: str, known_as: Set[str]) -> HostKeyError:
    found = _KEY_HOST.search(stderr)
    key_host = found.group(1) if found else name
    fingerprint = _FINGERPRINT.search(stderr)
    offered = re.findall(r"Server host (?:key|certificate): (\S+) (SHA256:[^\s,]+)", stderr)
    seen = (f" (the host sent {offered[-1][0]} {offered[-1][1]})" if offered
            else f" (the host sent {fingerprint.group(0)})" if fingerprint else "")
    whose = name if key_host in known_as else f"{key_host} (the jump host on the way to {name})"
    if "CHANGED" in stderr:
        return HostKeyError(f"ssh {whose}: the host key CHANGED{seen}",
                            hint="If the host was legitimately reinstalled, remove the old line with "
                            f"`ssh-keygen -R {shlex.quote(key_host)}`; otherwise do not connect.")
    if "host key is known for" in stderr:
        return HostKeyError(f"ssh {whose}: host key not in known_hosts{seen}", hint=_unknown_hint(policy))
    detail = " ".join(line for line in stderr.strip().splitlines() if "Server host " not in line)[-300:]
    return HostKeyError(f"ssh {whose}: host key not accepted{seen}: {detail}", hint=_unknown_hint(policy))


def _unknown_hint(policy: str) -> str:
    return ("Verify the fingerprint out of band, then add it (`ssh-keyscan` or one `ssh` login)"
            + (", or set `host.host_key_policy: accept-new` to trust it on first use." if policy != "accept-new" else "."))


def _whole_seconds(seconds: float) -> int:
    """ssh takes whole seconds, at least 1: the nearest, within half a second of what is left (the process is
    killed at the deadline whatever ssh's own timers say)."""
    return max(1, int(seconds + 0.5))


def ssh_on_path() -> str | None:
    """shutil.which("ssh"), without importing shutil (and bz2, lzma with it: ~2 ms of every command that
    connects, a tail's among them): the first executable `ssh` in PATH's directories, in order."""
    path = os.environ.get("PATH", os.defpath)
    for directory in dict.fromkeys(path.split(os.pathsep) if path else []):
        name = os.path.join(directory, "ssh")
        if os.access(name, os.X_OK) and not os.path.isdir(name):
            return name
    return None


def for_host(host: dict) -> Transport:
    """The transport a host section asks for: local, or `host.transport` (auto = OpenSSH when `ssh` exists)."""
    if host["address"] == "local":
        return LocalTransport()
    _check_ssh_config(os.environ.get("RUNNER_SSH_CONFIG"))
    target = SshTarget(address=host["address"], user=host.get("user"), port=host.get("port"),
                       host_key_policy=host.get("host_key_policy", "strict"),
                       connect_timeout=host.get("connect_timeout", 10.0))
    kind = host.get("transport", "auto")
    ssh = ssh_on_path() if kind in ("auto", "openssh") else None
    if kind == "openssh" and ssh is None:
        raise SpecError("host.transport: openssh, but no `ssh` client is on PATH",
                        hint="Install OpenSSH's client, or set host.transport: paramiko.")
    if ssh is None:
        return SshTransport(target)
    from ..state.store import default_state_dir

    return OpenSshTransport(target, state=default_state_dir(), ssh=ssh)


def _check_ssh_config(path: str | None) -> None:
    """RUNNER_SSH_CONFIG names a file of this machine (`ssh -F`): one that cannot be read is a local mistake
    (exit 2), said before ssh turns it into an unreachable host."""
    if path:
        try:
            open(path, "rb").close()
        except OSError as exc:
            raise SpecError(f"RUNNER_SSH_CONFIG={path}: {exc.strerror}",
                            hint="Point it at an ssh_config file, or unset it (ssh then reads ~/.ssh/config).") from None

