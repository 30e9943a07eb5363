"""A real OpenSSH server on 127.0.0.1 for tests, in its own PID and mount namespace.

    unshare --pid --fork --kill-child --mount … sh -c 'mount tmpfs /run; …; exec sshd -D -e -f CONFIG'

Why the namespaces: sshd needs a root-owned /run/sshd, which we keep private; and when sshd (PID 1 of
the namespace) exits, the kernel kills every session and nohup'd job started through it, so a test
never leaks a detached process. Inside the namespace the nvidia-smi test stand-in is on PATH
(/usr/local/sbin is a private tmpfs there) and reads this host's fake GPU state dir.

Logins have plain shells and homes of their own, so the suite never depends on this machine's login setup
(root's ~/.bashrc here runs `pyenv init`, ~0.2 s per SSH command) and two test runs never share a home:
root's /root is an empty dir of this host bind-mounted over /root inside the namespace, and the non-root
logins are created for this host (`rt-<pid>-<n>-<role>`, HOME an empty dir in the host's workdir) and
removed at teardown.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from . import gpu_state
from ._proc import (child_pids, create_host_logins, die_with_parent, free_port, host_workdir, port_accepts,
                    remove_host_logins, wait_until)

SSHD = "/usr/sbin/sshd"
ADDRESS = "127.0.0.1"
ROOT_ALIAS = "testhost"
ROOT_HOME = "/root"
REPO = Path(__file__).resolve().parents[2]
GPU_FIELDS = "index,uuid,name,memory.total,memory.used,memory.free"
# Both root and non-root sessions get this PATH (sshd's default for non-root lacks /usr/local/sbin).
SESSION_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class SshHost:
    """One login (user) on a running test sshd; `as_user` gives the same server for another login."""

    address: str
    port: int
    user: str
    key_path: Path
    known_hosts: Path
    ssh_config: Path
    alias: str
    host_key: str  # "ssh-ed25519 AAAA…", the server's public host key
    gpu_dir: Path  # the nvidia-smi stand-in's state dir, as seen from the test process
    workdir: Path
    process: subprocess.Popen = field(repr=False)
    logins: tuple[str, ...] = ()  # the non-root logins created for this host, removed by `stop`

    @property
    def non_root_user(self) -> str:
        return self.logins[0]

    def as_user(self, user: str) -> "SshHost":
        return dataclasses.replace(self, user=user, alias=alias_for(user))

    def ssh(self, argv: list[str], *, input: str | None = None, timeout: float = 30,
            check: bool = False) -> subprocess.CompletedProcess:
        """Run argv on the host with the OpenSSH client through the alias (quoted once, like the runner)."""
        command = ["ssh", "-F", str(self.ssh_config), self.alias, "--", shlex.join(argv)]
        return subprocess.run(command, input=input, capture_output=True, text=True, timeout=timeout,
                              check=check)

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """`ssh`, under the name the service-host helpers use."""
        return self.ssh(argv, **kwargs)

    def gpu_used_mib(self, index: int = 0) -> int:
        """memory.used of GPU `index` as the host's nvidia-smi (the test stand-in) reports it."""
        result = self.ssh(["nvidia-smi", f"--query-gpu={GPU_FIELDS}", "--format=csv,noheader,nounits"],
                          check=True)
        for line in result.stdout.splitlines():
            fields = [value.strip() for value in line.split(",")]
            if int(fields[0]) == index:
                return int(fields[4])
        raise LookupError(f"no GPU {index} in {result.stdout!r}")

    def set_gpu(self, total_mib: int = gpu_state.H200_TOTAL_MIB, baseline_used: int = 0, count: int = 1) -> None:
        """Change the fake cards: size, memory other processes use, how many."""
        gpu_state.write_gpus(self.gpu_dir, total_mib=total_mib, baseline_used=baseline_used, count=count)

    def wrong_known_hosts(self) -> Path:
        """A known_hosts naming this host with another key, for host-key-mismatch tests."""
        other = self.workdir / "other_host_key"
        if not other.exists():
            generate_key(other)
        path = self.workdir / "known_hosts.wrong"
        path.write_text(known_hosts_line(self.port, public_key(other), self.address))
        return path

    def empty_known_hosts(self) -> Path:
        """A known_hosts that does not know this host, for unknown-host-key tests."""
        path = self.workdir / "known_hosts.empty"
        path.write_text("")
        return path

    def stop(self) -> None:
        """Stop sshd, the namespace's PID 1 (the kernel then kills every process inside); remove its files.

        `unshare` ignores SIGTERM, so signal its child; SIGKILL on unshare is the fallback
        (--kill-child turns it into SIGKILL for the namespace).
        """
        if self.process.poll() is None:
            for pid in child_pids(self.process.pid):
                signal_quietly(pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        remove_host_logins(self.logins)
        shutil.rmtree(self.workdir, ignore_errors=True)


def alias_for(user: str) -> str:
    return ROOT_ALIAS if user == "root" else f"{ROOT_ALIAS}-{user}"


def signal_quietly(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def generate_key(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "runner-test", "-f", str(path)],
                   check=True, capture_output=True)


def public_key(private_path: Path) -> str:
    """"ssh-ed25519 AAAA…" without the comment."""
    return " ".join(Path(f"{private_path}.pub").read_text().split()[:2])


def known_hosts_line(port: int, key: str, address: str = ADDRESS) -> str:
    host = address if port == 22 else f"[{address}]:{port}"
    return f"{host} {key}\n"


# The key exchanges the test sshd offers: curve25519 only. OpenSSH 9's default, the post-quantum hybrid
# sntrup761x25519, costs ~130 ms of client CPU per connection on these 2-core machines against ~10 ms for
# curve25519 (`/usr/bin/time ssh HOST true`: 0.13-0.14 s user vs 0.01 s); the suite's own checks and cold
# controller calls open hundreds of connections a minute, and their key exchanges were the largest share of
# its CPU (process accounting during `.ci/run`: ssh clients 44 s of ~100 s). The negotiation is the client's
# first choice that the server offers, so every client here (OpenSSH, paramiko) gets curve25519-sha256.
# RUNNER_TEST_SSHD_KEX=default keeps OpenSSH's own list: the benches set it, their baselines being plain ssh
# lines measured that way.
CLASSIC_KEX = "curve25519-sha256,curve25519-sha256@libssh.org"


def kex_line() -> list[str]:
    kex = os.environ.get("RUNNER_TEST_SSHD_KEX", CLASSIC_KEX)
    return [] if kex == "default" else [f"KexAlgorithms {kex}"]


def sshd_config_text(workdir: Path, port: int, address: str) -> str:
    return "\n".join([
        f"Port {port}",
        f"ListenAddress {address}",
        f"HostKey {workdir / 'host_key'}",
        "PidFile none",
        f"AuthorizedKeysFile {workdir / 'authorized_keys'}",
        "UsePAM no",
        "StrictModes no",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "Subsystem sftp internal-sftp",
        f"SetEnv PATH={SESSION_PATH}",
        *kex_line(),
        "",
    ])


def ssh_config_text(workdir: Path, port: int, users: list[str], address: str) -> str:
    blocks = []
    for user in users:
        blocks.append("\n".join([
            f"Host {alias_for(user)}",
            f"    HostName {address}",
            f"    Port {port}",
            f"    User {user}",
            f"    IdentityFile {workdir / 'client_key'}",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {workdir / 'known_hosts'}",
            "    GlobalKnownHostsFile /dev/null",
            "    StrictHostKeyChecking yes",
            "    BatchMode yes",
            "    ConnectTimeout 5",
            "    LogLevel ERROR",
            "",
        ]))
    return "\n".join(blocks)


def write_ssh_files(workdir: Path, port: int, users: list[str], address: str = ADDRESS) -> None:
    """Host key, one client key accepted for every user, sshd_config, known_hosts, ssh_config."""
    for name in ("host_key", "client_key"):
        if not (workdir / name).exists():
            generate_key(workdir / name)
    (workdir / "authorized_keys").write_text(public_key(workdir / "client_key") + "\n")
    (workdir / "authorized_keys").chmod(0o644)
    (workdir / "sshd_config").write_text(sshd_config_text(workdir, port, address))
    (workdir / "known_hosts").write_text(known_hosts_line(port, public_key(workdir / "host_key"), address))
    (workdir / "ssh_config").write_text(ssh_config_text(workdir, port, users, address))


def root_home(workdir: Path) -> Path:
    """The empty dir this host mounts over /root: root's ~/.runner (jobs, locks) stays private to the host."""
    return workdir / "home" / "root"


def make_root_home(workdir: Path) -> Path:
    """Create `root_home`; refuse when the checkout is under /root, which the mount would hide."""
    if REPO.is_relative_to(ROOT_HOME):
        raise RuntimeError(f"the test hosts mount an empty home over {ROOT_HOME}, which would hide this "
                           f"checkout ({REPO}); clone it elsewhere (e.g. under /tmp)")
    home = root_home(workdir)
    home.mkdir(mode=0o700, parents=True)
    return home


def namespace_setup_script(workdir: Path, gpu_dir: Path) -> str:
    """Shell lines run inside the private mount namespace before sshd: private /run (its /run/lock: runner's host
    lock place is the host's own) and /root, the stand-in."""
    standin_dir = "/usr/local/sbin"
    lines = [
        "set -e",
        "mount -t tmpfs -o mode=0755 tmpfs /run",
        "mkdir -m 0755 /run/sshd",
        "mkdir -m 1777 /run/lock",  # the host lock place, as systemd-tmpfiles makes it
        f"mkdir -m 0755 {gpu_state.STATE_DIR_IN_HOST}",
        f"mount --bind {shlex.quote(str(gpu_dir))} {gpu_state.STATE_DIR_IN_HOST}",
        f"mount -t tmpfs -o mode=0755 tmpfs {standin_dir}",
        f"cp {shlex.quote(str(gpu_state.STANDIN))} {standin_dir}/nvidia-smi",
        f"chmod 0755 {standin_dir}/nvidia-smi",
        f"mount --bind {shlex.quote(str(root_home(workdir)))} {ROOT_HOME}",
    ]
    return "\n".join(lines)


def wait_for_sshd(process: subprocess.Popen, port: int, log: Path, address: str = ADDRESS) -> None:
    """Wait until sshd accepts connections; RuntimeError when it exited (e.g. the port was taken)."""
    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"sshd exited with {process.returncode}: {log.read_text()[-2000:]}")
        return port_accepts(address, port)

    try:
        wait_until(ready, timeout=30, what=f"sshd on port {port} (log: {log})")
    except TimeoutError:
        process.kill()
        raise


def launch_sshd(workdir: Path, gpu_dir: Path, users: list[str]) -> tuple[subprocess.Popen, int]:
    for _attempt in range(3):  # the picked port may be taken before sshd binds it
        port = free_port()
        write_ssh_files(workdir, port, users)
        config = shlex.quote(str(workdir / "sshd_config"))
        script = f"{namespace_setup_script(workdir, gpu_dir)}\nexec {SSHD} -D -e -f {config}\n"
        log = workdir / "sshd.log"
        with open(log, "ab") as log_file:
            process = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--propagation", "private",
                 "--mount-proc", "--", "sh", "-c", script],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, preexec_fn=die_with_parent)
        try:
            wait_for_sshd(process, port, log)
            return process, port
        except RuntimeError:
            continue
    raise RuntimeError(f"sshd did not start; see {workdir / 'sshd.log'}")


def start_sshd(shells: dict | None = None) -> SshHost:
    """Start a test sshd accepting one client key for root and a fresh non-root login (`non_root_user`),
    plus one login per role in `shells` ({role: login shell}, after it in `logins`); returns the root login
    (`as_user` for the others)."""
    workdir = host_workdir("sshd")
    make_root_home(workdir)
    logins = create_host_logins(workdir, ("user", *(shells or {})), shells)
    try:
        gpu_dir = gpu_state.make_state_dir(workdir / "gpu")
        process, port = launch_sshd(workdir, gpu_dir, ["root", *logins])
    except BaseException:
        remove_host_logins(logins)
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return SshHost(address=ADDRESS, port=port, user="root", key_path=workdir / "client_key",
                   known_hosts=workdir / "known_hosts", ssh_config=workdir / "ssh_config",
                   alias=ROOT_ALIAS, host_key=public_key(workdir / "host_key"), gpu_dir=gpu_dir,
                   workdir=workdir, process=process, logins=logins)
