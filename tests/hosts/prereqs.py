"""What each kind of test host needs from the machine, as human-readable reasons when something is missing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

SSHD = Path("/usr/sbin/sshd")
SYSTEMD = Path("/lib/systemd/systemd")
SYSTEMD_USER_UNITS = Path("/usr/lib/systemd/user")


def cgroup2_root() -> Path | None:
    """Where the cgroup2 hierarchy is mounted: /sys/fs/cgroup/unified on hybrid hosts, else /sys/fs/cgroup."""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def missing_tools(package_by_tool: dict[str, str]) -> list[str]:
    return [f"no {tool} on PATH (apt-get install {package})"
            for tool, package in package_by_tool.items() if shutil.which(tool) is None]


def missing_for_sshd() -> list[str]:
    missing = []
    if os.geteuid() != 0:
        missing.append("not root (the test sshd needs namespaces and a root-owned /run/sshd)")
    if not SSHD.exists():
        missing.append(f"no {SSHD} (apt-get install openssh-server)")
    missing += missing_tools({"ssh": "openssh-client", "ssh-keygen": "openssh-client", "unshare": "util-linux"})
    return missing


def missing_for_systemd_host() -> list[str]:
    missing = missing_for_sshd()
    root = cgroup2_root()
    if root is None:
        missing.append("no cgroup2 hierarchy mounted (the systemd test host is confined in a cgroup2 subtree)")
    elif not os.access(root, os.W_OK):
        missing.append(f"cgroup2 at {root} is not writable")
    if not SYSTEMD.exists() or not (SYSTEMD_USER_UNITS / "exit.target").exists():
        missing.append(f"no {SYSTEMD} or {SYSTEMD_USER_UNITS}/exit.target (apt-get install systemd)")
    missing += missing_tools({"systemctl": "systemd", "sudo": "sudo"})
    return missing


def missing_for_netns_host() -> list[str]:
    missing = missing_for_systemd_host()
    missing += missing_tools({"ip": "iproute2", "iptables": "iptables", "nsenter": "util-linux"})
    return missing


def require(missing: list[str]) -> None:
    """Skip when the machine lacks what a host needs; in CI (CI=true) that is a failure, not a skip."""
    if not missing:
        return
    reason = "test host prerequisites missing: " + "; ".join(missing)
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)
