"""Who answers on the unit's health port: a restorer believes a health answer only from the unit itself.

A process outside the unit that holds the port (a `payload.user` process started by cron or a lingering user
unit, a stray server) answers /health for a unit that is down or cannot bind; a restorer that believed it
would say "healthy" with the service gone. So once the health URL answers, the TCP listener of its port is
looked up in /proc/net/tcp{,6}, and every socket listening there must belong to a process of the unit's
cgroup (its MainPID's, up to the unit's own component, read through /sys/fs/cgroup; the unit's processes and
their children).

`foreign_holder` answers a description of the first process outside the unit that holds such a socket, or
None when every listener is the unit's — and also None whenever it cannot tell (the URL's host is not this
machine's loopback or wildcard, no listener is visible in this network namespace, the cgroup or a process's
fds cannot be read: a non-root login under `sudo: true`): then the answer is believed as before. Stdlib only;
its parsers of /proc text are host/parsers.py's, tested on captured /proc output.
"""
from __future__ import annotations

import os
from urllib.parse import urlsplit

from .parsers import parse_cgroup, parse_listeners

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::")






def local_port(url: str):
    """The port of a health URL on this machine's loopback (or wildcard) address, None for another host."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return port if (parts.hostname or "") in LOCAL_HOSTS else None


def listening_inodes(port: int) -> set:
    inodes = set()  # type: set
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                inodes |= parse_listeners(fh.read()).get(port, set())
        except OSError:
            continue
    return inodes


def socket_inodes(pid: int):
    """The socket inodes pid holds; None when its fds cannot be read (another user's, without root)."""
    base = "/proc/%d/fd" % pid
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return set()  # gone: it holds nothing
    except OSError:
        return None
    inodes = set()
    for name in names:
        try:
            target = os.readlink(os.path.join(base, name))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def cgroup_pids(control_group: str):
    """Every process of the cgroup and its sub-cgroups; None when it cannot be read."""
    top = os.path.join("/sys/fs/cgroup", control_group.lstrip("/"))
    if not control_group or not os.path.isdir(top):
        return None
    pids = []
    try:
        for folder, _, files in os.walk(top):
            if "cgroup.procs" in files:
                with open(os.path.join(folder, "cgroup.procs")) as fh:
                    pids += [int(word) for word in fh.read().split()]
    except (OSError, ValueError):
        return None
    return pids


def unit_cgroup(pid: int, unit: str):
    """The cgroup of `unit`, from its MainPID's /proc/PID/cgroup: the path up to the unit's own component (a
    unit that delegates puts its processes in sub-cgroups: the whole unit counts), or the process's own; None
    when it cannot be read."""
    try:
        with open("/proc/%d/cgroup" % pid) as fh:
            return unit_part(parse_cgroup(fh.read()), unit)
    except OSError:
        return None


def unit_part(path, unit: str):
    """A cgroup path cut after the unit's own component (the path as it is when the unit is not in it)."""
    if not path:
        return None
    parts = path.split("/")
    return "/".join(parts[:parts.index(unit) + 1]) if unit in parts else path


def describe(pid: int) -> str:
    try:
        with open("/proc/%d/comm" % pid) as fh:
            comm = fh.read().strip()
    except OSError:
        comm = "?"
    try:
        with open("/proc/%d/cgroup" % pid) as fh:
            where = parse_cgroup(fh.read()) or "?"
    except OSError:
        where = "?"
    return "pid %d (%s, cgroup %s)" % (pid, comm, where)


def foreign_holder(control_group: str, url: str):
    """A description of a process outside control_group that listens on url's port, or None (the unit's own,
    or it cannot be told: see the module's doc)."""
    port = local_port(url or "")
    if port is None:
        return None
    inodes = listening_inodes(port)
    if not inodes:
        return None
    pids = cgroup_pids(control_group)
    if pids is None:
        return None
    for pid in pids:
        held = socket_inodes(pid)
        if held is None:
            return None
        inodes -= held
        if not inodes:
            return None
    for name in os.listdir("/proc"):  # someone else holds what is left: name it
        if name.isdigit() and int(name) not in pids:
            held = socket_inodes(int(name))
            if held and held & inodes:
                return "port %d is held by %s, outside the unit (%s)" % (port, describe(int(name)), control_group)
    return None  # its holder cannot be seen from here: cannot tell
