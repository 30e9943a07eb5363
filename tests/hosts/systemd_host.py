"""A test host with a real systemd service manager: `systemd --user` + sshd, confined.

WARNING (tests/hosts notes): `systemd --user` started in the machine's root cgroup moves every process of
the machine into a new cgroup. So the host runs in its own cgroup2 subtree CG and under
`unshare --cgroup --mount`, and the launch script refuses to start systemd unless /proc/self/cgroup says
it is in CG before the unshare and at the namespace root (`0::/`) after it. Teardown kills the whole
subtree at once (cgroup.kill): manager, units, sshd, sessions, detached jobs.

Inside the mount namespace: a private /run; the manager's private socket bind-mounted on
/run/systemd/private, so plain `systemctl` as root (also through `sudo -n`) reaches it; a private
/etc/sudoers.d (a rule for the host's `sudo_user`, none for its `nosudo_user`); an empty /root of the
host's own (root logs in with a plain shell); the nvidia-smi stand-in on PATH. Root is the login of the
host because the manager is root's; the two non-root logins are created for the host and removed with it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import gpu_state, sshd
from ._proc import (create_host_logins, die_with_parent, free_port, host_workdir, pid_alive, remove_host_logins,
                    wait_until)
from .prereqs import SYSTEMD, SYSTEMD_USER_UNITS, cgroup2_root

UNIT = "dummy-infer.service"
LOGIN_ROLES = ("sudo", "nosudo")  # the non-root logins, in `logins` order
DUMMY_SERVER = Path(__file__).parent / "dummy_inference.py"
ENGINE_STANDIN = Path(__file__).parent / "engine_standin.py"
COPIED_UNITS = ("shutdown.target", "exit.target", "systemd-exit.service")
STUB_UNITS = ("test.target", "basic.target")
BASE_UNITS = STUB_UNITS + COPIED_UNITS
SUDO_RULE = "{user} ALL=(root) NOPASSWD: /usr/bin/systemctl, /bin/systemctl\n"
# What the host itself runs (health probe, dummy unit) needs only the stdlib. An absolute system python:
# the test process's own interpreter may live under /root, which the host hides.
HOST_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else "python3"
# Root sessions find the user manager like pam_systemd sessions do, so `systemctl --user` works too.
ROOT_SESSION_CONFIG = "Match User root\n    SetEnv XDG_RUNTIME_DIR=/run/user/0\n"
MANAGER_SOCKET = "/run/user/0/systemd/private"
_host_numbers = itertools.count()


@dataclass
class ServiceHost(sshd.SshHost):
    """An SshHost whose machine runs `unit` under a real systemd manager, with a health URL and fake GPU."""

    unit: str = UNIT
    health_url: str = ""
    service_port: int = 0
    cgroup: Path = Path()
    units_dir: Path = Path()
    service_log: Path = Path()

    @property
    def sudo_user(self) -> str:
        """A non-root login that may `sudo -n systemctl …`."""
        return self.logins[0]

    @property
    def nosudo_user(self) -> str:
        """A non-root login without a sudo rule ("sudo: a password is required")."""
        return self.logins[1]

    @contextlib.contextmanager
    def sudo_rule(self, rule: str):
        """`sudo_user`'s sudoers rule is `rule` (checked by visudo) inside the block, then the broad one again."""
        path = self.workdir / "sudoers.d" / "runner-test"
        path.write_text(rule)
        try:
            subprocess.run(["visudo", "-cqf", str(path)], check=True, capture_output=True)
            yield
        finally:
            path.write_text(SUDO_RULE.format(user=self.sudo_user))

    def systemctl(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return self.ssh(["systemctl", *args], timeout=timeout)

    def service_state(self, unit: str | None = None) -> str:
        """ActiveState: active, inactive, activating, deactivating or failed."""
        return self.systemctl("show", "-P", "ActiveState", unit or self.unit).stdout.strip()

    def health_status(self) -> int:
        """HTTP status of the health URL as seen on the host (0 when nothing listens)."""
        probe = ("import sys, urllib.request, urllib.error\n"
                 "try:\n    print(urllib.request.urlopen(sys.argv[1], timeout=2).status)\n"
                 "except urllib.error.HTTPError as e:\n    print(e.code)\n"
                 "except OSError:\n    print(0)\n")
        return int(self.ssh([HOST_PYTHON, "-c", probe, self.health_url], check=True).stdout)

    def install_unit(self, name: str | None = None, **knobs) -> str:
        """Write a dummy-inference unit (knobs: hold_mib, ready_delay, release_delay, fail_on_start,
        start_delay, port) and reload the manager; returns the unit name."""
        name = name or self.unit
        (self.units_dir / name).write_text(dummy_unit_text(self.service_log, **{"port": self.service_port, **knobs}))
        self.systemctl("daemon-reload").check_returncode()
        return name

    def install_engine_unit(self, engine: str = "sglang", *flags: str, weights_mib: int = 60000,
                            kv_mib: int = 60000, environment: dict | None = None) -> Path:
        """Make `unit` the engine stand-in (tests/hosts/engine_standin.py) on the health port, restart it and
        wait until healthy; returns the file its requests are logged to (JSON lines, emptied here).
        environment: the unit's own Environment= assignments."""
        calls = self.workdir / "engine-calls.jsonl"
        calls.unlink(missing_ok=True)
        argv = [HOST_PYTHON, str(ENGINE_STANDIN), "--engine", engine, "--port", str(self.service_port),
                "--weights-mib", str(weights_mib), "--kv-mib", str(kv_mib), "--calls", str(calls), *flags]
        lines = dummy_unit_text(self.service_log, port=self.service_port).splitlines()
        settings = "".join(f"\nEnvironment={shlex.quote(f'{name}={value}')}" for name, value in (environment or {}).items())
        (self.units_dir / self.unit).write_text("\n".join(
            f"ExecStart={shlex.join(argv)}{settings}" if line.startswith("ExecStart=") else line for line in lines) + "\n")
        self.systemctl("daemon-reload").check_returncode()
        self.systemctl("restart", self.unit).check_returncode()
        wait_until(lambda: self.health_status() == 200, timeout=60, what=f"{self.unit} (engine stand-in) healthy")
        calls.unlink(missing_ok=True)
        return calls

    def reset(self) -> None:
        """Back to the known state: default unit active and healthy, fake GPU default, no runner locks or
        ledger entries (the host lock place, /run/lock/runner-*).

        The unit is restarted only when a test changed it or it is not serving: a restart costs the
        unit's ready delay on every test.
        """
        self.set_gpu()
        self.remove_extra_units()
        unit_file = self.units_dir / self.unit
        default_text = dummy_unit_text(self.service_log, port=self.service_port)
        changed = not unit_file.exists() or unit_file.read_text() != default_text
        if changed:
            self.install_unit()
        if changed or self.service_state() != "active" or self.health_status() != 200:
            self.systemctl("reset-failed")
            self.systemctl("restart", self.unit).check_returncode()
            wait_until(lambda: self.health_status() == 200, timeout=60, what=f"{self.unit} healthy")
        self.release_foreign_gpu_memory()
        self.ssh(["sh", "-c", "rm -rf /run/lock/runner-*"], check=True)

    def remove_extra_units(self) -> None:
        """Stop and delete units a test installed under other names."""
        extra = [path for path in self.units_dir.iterdir() if path.name not in BASE_UNITS + (self.unit,)]
        if not extra:
            return
        self.systemctl("stop", *(path.name for path in extra))
        for path in extra:
            path.unlink()
        self.systemctl("daemon-reload").check_returncode()
        self.systemctl("reset-failed")

    def release_foreign_gpu_memory(self) -> None:
        """Forget memory "held" by anything but the unit (a payload a test left running)."""
        main_pid = self.systemctl("show", "-P", "MainPID", self.unit).stdout.strip()
        for path in (self.gpu_dir / "apps").iterdir():
            if path.name != main_pid:
                path.unlink(missing_ok=True)

    def stop(self) -> None:
        """Kill everything in the host's cgroup subtree at once, wait until it is empty, remove it."""
        kill_cgroup_tree(self.cgroup)
        self.process.wait(timeout=10)
        remove_host_logins(self.logins)
        shutil.rmtree(self.workdir, ignore_errors=True)


def dummy_unit_text(log: Path, port: int, hold_mib: int = 4096, ready_delay: float = 2.0,
                    release_delay: float = 0.5, fail_on_start: bool = False, start_delay: float = 0) -> str:
    argv = [HOST_PYTHON, str(DUMMY_SERVER), "--port", str(port), "--hold-mib", str(hold_mib),
            "--ready-delay", str(ready_delay), "--release-delay", str(release_delay)]
    if fail_on_start:
        argv.append("--fail-on-start")
    lines = ["[Unit]", "Description=runner test: dummy inference server", "", "[Service]", "Type=simple"]
    if start_delay:
        lines.append(f"ExecStartPre=/bin/sleep {start_delay}")  # keeps the unit "activating" that long
    lines += [f"ExecStart={shlex.join(argv)}", f"StandardOutput=append:{log}", f"StandardError=append:{log}", ""]
    return "\n".join(lines)


def write_units_dir(units_dir: Path) -> None:
    units_dir.mkdir()
    for target in STUB_UNITS:
        (units_dir / target).write_text(f"[Unit]\nDescription=runner test host {target}\n")
    for name in COPIED_UNITS:
        (units_dir / name).write_text((SYSTEMD_USER_UNITS / name).read_text())


def write_private_sudoers(sudoers_dir: Path, sudo_user: str) -> None:
    """A copy of /etc/sudoers.d plus our rule for `sudo_user`, bind-mounted over it inside the host only."""
    sudoers_dir.mkdir(mode=0o755)
    for entry in Path("/etc/sudoers.d").iterdir():
        (sudoers_dir / entry.name).write_bytes(entry.read_bytes())
        (sudoers_dir / entry.name).chmod(0o440)
    rule = sudoers_dir / "runner-test"
    rule.write_text(SUDO_RULE.format(user=sudo_user))
    rule.chmod(0o440)


def inner_script(workdir: Path, gpu_dir: Path) -> str:
    """Runs after `unshare --cgroup --mount`: confirm confinement, then mounts, manager, sshd."""
    config = shlex.quote(str(workdir / "sshd_config"))
    manager_env = shlex.join(["env", "-i", f"PATH={sshd.SESSION_PATH}", "HOME=/root", "USER=root",
                              "XDG_RUNTIME_DIR=/run/user/0", f"SYSTEMD_UNIT_PATH={workdir / 'units'}"])
    return "\n".join([
        "grep -qx '0::/' /proc/self/cgroup"
        " || { echo 'refusing to start systemd: not at a cgroup namespace root' >&2; exit 97; }",
        sshd.namespace_setup_script(workdir, gpu_dir),
        "mount -t cgroup2 none /sys/fs/cgroup",
        "mkdir -p /run/systemd/system /run/user/0",
        "chmod 700 /run/user/0",
        "touch /run/systemd/private",
        f"mount --bind {shlex.quote(str(workdir / 'sudoers.d'))} /etc/sudoers.d",
        f"{manager_env} {SYSTEMD} --user --unit=test.target --log-target=console"
        f" </dev/null >{shlex.quote(str(workdir / 'systemd.log'))} 2>&1 &",
        # the manager's socket, within 60 s (10 s was too little for two suites side by side on 2 cores)
        f"n=0; while [ ! -S {MANAGER_SOCKET} ]; do n=$((n+1)); [ $n -lt 2400 ] ||"
        " { echo 'systemd --user made no socket in 60 s' >&2; exit 98; }; sleep 0.025; done",
        f"mount --bind {MANAGER_SOCKET} /run/systemd/private",
        f"exec {sshd.SSHD} -D -e -f {config}",
    ])


def outer_script(cgroup: Path, workdir: Path) -> str:
    """Joins CG, checks it really is in CG, then enters the private cgroup + mount namespaces."""
    relative = "/" + str(cgroup.relative_to(cgroup2_root()))
    inner = workdir / "inner.sh"
    return "\n".join([
        "set -e",
        f"echo $$ > {shlex.quote(str(cgroup / 'cgroup.procs'))}",
        f"grep -qx {shlex.quote('0::' + relative)} /proc/self/cgroup"
        " || { echo 'refusing to start systemd: not in the test cgroup' >&2; exit 97; }",
        f"exec unshare --cgroup --mount --propagation private sh {shlex.quote(str(inner))}",
    ])


def kill_cgroup_tree(cgroup: Path) -> None:
    if not cgroup.exists():
        return
    (cgroup / "cgroup.kill").write_text("1")
    wait_until(lambda: "populated 0" in (cgroup / "cgroup.events").read_text(), timeout=10,
               what=f"{cgroup} to empty")
    for path in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        path.rmdir()
    cgroup.rmdir()


def remove_stale_cgroups() -> None:
    """Kill hosts left by test runs that died without teardown (their sshd died with them, the manager
    did not): our cgroups are named runner-test-<owner pid>-<n>; the owner is gone."""
    for cgroup in cgroup2_root().glob("runner-test-*-*"):
        owner = re.fullmatch(r"runner-test-(\d+)-\d+", cgroup.name)
        if owner and not pid_alive(int(owner.group(1))):
            kill_cgroup_tree(cgroup)


def new_cgroup() -> Path:
    remove_stale_cgroups()
    cgroup = cgroup2_root() / f"runner-test-{os.getpid()}-{next(_host_numbers)}"
    cgroup.mkdir()
    return cgroup


@dataclass
class Placement:
    """Where the host's sshd listens and what its processes are started through (e.g. nsenter --net)."""

    address: str = sshd.ADDRESS
    port: int | None = None  # None: a free loopback port, retried if taken before sshd binds it
    wrapper: tuple[str, ...] = ()


def launch(workdir: Path, cgroup: Path, gpu_dir: Path, placement: Placement,
           users: list[str]) -> tuple[subprocess.Popen, int]:
    why = ""
    for _attempt in range(3):
        port = placement.port or free_port()
        sshd.write_ssh_files(workdir, port, users, placement.address)
        with open(workdir / "sshd_config", "a") as config:
            config.write(ROOT_SESSION_CONFIG)
        (workdir / "inner.sh").write_text(inner_script(workdir, gpu_dir) + "\n")
        log = workdir / "sshd.log"
        with open(log, "ab") as log_file:
            process = subprocess.Popen([*placement.wrapper, "sh", "-c", outer_script(cgroup, workdir)],
                                       stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                                       preexec_fn=die_with_parent)
        try:
            sshd.wait_for_sshd(process, port, log, placement.address)
            return process, port
        except RuntimeError as failed:
            why = f"{failed}\nsystemd.log: {_tail(workdir / 'systemd.log')}"
            kill_cgroup_tree(cgroup)
            cgroup.mkdir()
    raise RuntimeError(f"systemd test host did not start (three tries); the last: {why}")


def _tail(path: Path, size: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError as missing:
        return str(missing)


def start_service_host(placement: Placement = Placement(), host_class: type = ServiceHost, **extra) -> ServiceHost:
    """Start a confined systemd manager + sshd with the dummy unit active and healthy.

    `host_class`/`extra` let a variant (the network-namespace host) add its own fields and teardown.
    """
    workdir = host_workdir("systemd")
    sshd.make_root_home(workdir)
    logins = create_host_logins(workdir, LOGIN_ROLES)
    gpu_dir = gpu_state.make_state_dir(workdir / "gpu")
    write_units_dir(workdir / "units")
    write_private_sudoers(workdir / "sudoers.d", sudo_user=logins[0])
    cgroup = new_cgroup()
    try:
        process, port = launch(workdir, cgroup, gpu_dir, placement, ["root", *logins])
    except BaseException:
        kill_cgroup_tree(cgroup)
        remove_host_logins(logins)
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    service_port = free_port()
    host = host_class(address=placement.address, port=port, user="root", key_path=workdir / "client_key",
                      known_hosts=workdir / "known_hosts", ssh_config=workdir / "ssh_config",
                      alias=sshd.ROOT_ALIAS, host_key=sshd.public_key(workdir / "host_key"), gpu_dir=gpu_dir,
                      workdir=workdir, process=process, logins=logins,
                      health_url=f"http://127.0.0.1:{service_port}/health",
                      service_port=service_port, cgroup=cgroup, units_dir=workdir / "units",
                      service_log=workdir / "dummy-infer.log", **extra)
    try:
        host.reset()
    except BaseException:
        host.stop()
        raise
    return host
