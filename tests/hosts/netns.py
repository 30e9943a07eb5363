"""A systemd test host inside its own network namespace: a separate machine at 10.231.x.2 whose link
tests can cut and restore.

Safety (tests/hosts notes): before any veth exists, `blackhole 10.231.0.0/16` is routed, so traffic for a
test address never leaves through the real default route when a link is down. Several test runs may share
the machine: the route, the choice of a free /30 and the link creation are done under one machine-wide
lock (NET_LOCK), and the route is removed only by the run that finds no test link left and only if a
test run added it (marker BLACKHOLE_MARKER), never while another run's namespace still exists. A cut is an iptables DROP
inside the namespace: open sessions stall and new connects time out, as on a real outage. Processes
start through `nsenter --net` (not `ip netns exec`, which remounts /sys and hides the cgroup2 tree).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import itertools
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ._proc import pid_alive
from .systemd_host import Placement, ServiceHost, start_service_host

TEST_RANGE = ipaddress.ip_network("10.231.0.0/16")
SSH_PORT = 22
NETNS_PREFIX = "runner-test-"
# Shared by every test run on this machine on purpose: they coordinate through these two files.
NET_LOCK = Path("/tmp/runner-test-net.lock")
BLACKHOLE_MARKER = Path("/tmp/runner-test-net.blackhole-added")
_numbers = itertools.count()


@contextlib.contextmanager
def net_lock():
    """Machine-wide lock over the blackhole route, subnet choice and link creation/deletion."""
    with open(NET_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def addresses_in_test_range() -> set[ipaddress.IPv4Address]:
    """Test-range addresses on this machine's links (other test runs may hold some)."""
    found = set()
    for line in ip("-o", "-4", "addr", "show").stdout.splitlines():
        address = ipaddress.ip_interface(line.split()[3])
        if address.ip in TEST_RANGE:
            found.add(address.ip)
    return found


def free_subnet() -> ipaddress.IPv4Network:
    """The first /30 of the test range with no address on this machine's side."""
    used = addresses_in_test_range()
    for subnet in TEST_RANGE.subnets(new_prefix=30):
        if subnet[1] not in used:
            return subnet
    raise RuntimeError(f"no free /30 left in {TEST_RANGE}")


def has_blackhole() -> bool:
    return f"blackhole {TEST_RANGE}" in ip("route", "show", "type", "blackhole").stdout


def ensure_blackhole() -> None:
    """Route the test range to a blackhole (under `net_lock`); another test run may have added it already."""
    if not has_blackhole():
        BLACKHOLE_MARKER.touch()
        ip("route", "add", "blackhole", str(TEST_RANGE), check=False)
    if not has_blackhole():
        raise RuntimeError(f"could not route {TEST_RANGE} to a blackhole; refusing to create test links")


def namespaces_of_test_runs() -> list[str]:
    """Names of the network namespaces any test run made (runner-test-<pid>x<n>)."""
    names = (line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line.split())
    return [name for name in names if re.fullmatch(rf"{NETNS_PREFIX}\d+x\d+", name)]


def remove_blackhole_if_unused() -> None:
    """Under `net_lock`: remove the route only if a test run added it and no test link or namespace of any
    run is left (a run holds the lock from adding the route until its namespace exists)."""
    if BLACKHOLE_MARKER.exists() and not addresses_in_test_range() and not namespaces_of_test_runs():
        ip("route", "del", "blackhole", str(TEST_RANGE), check=False)
        BLACKHOLE_MARKER.unlink(missing_ok=True)


@dataclass
class NetnsLink:
    netns: str
    outer_veth: str
    inner_veth: str
    subnet: ipaddress.IPv4Network

    @property
    def host_address(self) -> str:
        return str(self.subnet[2])

    def create(self) -> None:
        ip("netns", "add", self.netns)
        ip("link", "add", self.outer_veth, "type", "veth", "peer", "name", self.inner_veth, "netns", self.netns)
        ip("addr", "add", f"{self.subnet[1]}/30", "dev", self.outer_veth)
        ip("link", "set", self.outer_veth, "up")
        ip("-n", self.netns, "addr", "add", f"{self.subnet[2]}/30", "dev", self.inner_veth)
        ip("-n", self.netns, "link", "set", self.inner_veth, "up")
        ip("-n", self.netns, "link", "set", "lo", "up")

    def delete(self) -> None:
        """Deleting the namespace deletes its end of the veth pair, and with it ours."""
        ip("netns", "del", self.netns, check=False)
        ip("link", "del", self.outer_veth, check=False)

    def iptables(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["nsenter", f"--net=/run/netns/{self.netns}", "iptables", *args],
                              capture_output=True, text=True, check=check)


@dataclass
class NetnsServiceHost(ServiceHost):
    """A ServiceHost reachable only over its veth link; `cut()` drops every packet arriving on it."""

    link: NetnsLink | None = None

    def cut(self) -> None:
        self.link.iptables("-A", "INPUT", "-i", self.link.inner_veth, "-j", "DROP")

    def restore(self) -> None:
        """Remove every DROP rule `cut` added (idempotent)."""
        while self.link.iptables("-D", "INPUT", "-i", self.link.inner_veth, "-j", "DROP",
                                 check=False).returncode == 0:
            pass

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            with net_lock():
                self.link.delete()
                remove_blackhole_if_unused()


def link_for(tag: str, subnet: ipaddress.IPv4Network) -> NetnsLink:
    # veth names are limited to 15 characters: "rtv" + "<pid>x<n>" (at most 7 + 1 + 3) + "a"
    return NetnsLink(netns=f"{NETNS_PREFIX}{tag}", outer_veth=f"rtv{tag}a", inner_veth=f"rtv{tag}b",
                     subnet=subnet)


def remove_stale_links() -> None:
    """Delete namespaces left by test runs that died without teardown (owner pid in the name is gone)."""
    for name in namespaces_of_test_runs():
        owner = re.fullmatch(rf"{NETNS_PREFIX}((\d+)x\d+)", name)
        if not pid_alive(int(owner.group(2))):
            link_for(owner.group(1), TEST_RANGE).delete()


def create_link() -> NetnsLink:
    """Blackhole first, then a /30 no other run uses, then the link: one step under `net_lock`, so two
    runs never pick the same subnet and none removes the route in between."""
    with net_lock():
        remove_stale_links()
        ensure_blackhole()
        link = link_for(f"{os.getpid()}x{next(_numbers)}", free_subnet())
        try:
            link.create()
        except BaseException:
            link.delete()
            remove_blackhole_if_unused()
            raise
        return link


def start_netns_host() -> NetnsServiceHost:
    """A systemd test host in a fresh network namespace; its sshd listens on port 22 of the link."""
    link = create_link()
    try:
        placement = Placement(address=link.host_address, port=SSH_PORT,
                              wrapper=("nsenter", f"--net=/run/netns/{link.netns}"))
        return start_service_host(placement, NetnsServiceHost, link=link)
    except BaseException:
        with net_lock():
            link.delete()
            remove_blackhole_if_unused()
        raise
