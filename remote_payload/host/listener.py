"""Whose answer is the health answer: a restorer believes it only from the unit's own listening socket.

A process outside the unit (a `payload.user` process, a stray server) can take the unit's port while the unit is
down and answer /health for a unit that cannot bind, even listening only for the moment of the request. So the
TCP sockets listening on the URL's port are read from /proc/net/tcp{,6} just before the request and just after
the answer, and the answer counts only when both looks find the same sockets, at least one, each the unit's:
held by a process of the unit's cgroup (read through /proc/PID/fd) or, where that cannot be read (a non-root
login under `sudo: true`, cgroup v1), made by the unit's user (the MainPID's real uid). A listening socket cannot
change hands, and no other user's socket can listen on the same address and port beside it, so an answer
between two such looks came through the unit's socket. A URL on another host: its answer alone counts.
"""
from __future__ import annotations

import os
from urllib.parse import urlsplit

from .parsers import parse_cgroup, parse_listeners
from .processes import real_uid

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::")


def local_port(url: str):
    """The port of a health URL on this machine's loopback (or wildcard) address, None for another host."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return port if (parts.hostname or "") in LOCAL_HOSTS else None


def listeners(port: int) -> dict:
    """{inode: uid} of the sockets listening on port, IPv4 and IPv6."""
    found = {}  # type: dict
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                found.update(parse_listeners(fh.read()).get(port, {}))
        except OSError:
            continue
    return found


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


def cgroup_of(pid: int):
    try:
        with open("/proc/%d/cgroup" % pid) as fh:
            return parse_cgroup(fh.read())
    except OSError:
        return None


def unit_cgroup(pid: int, unit: str):
    """The cgroup of `unit` from its MainPID's: the path up to the unit's own component (a unit that delegates
    puts its processes in sub-cgroups: the whole unit counts), or the process's own; None when unreadable."""
    return unit_part(cgroup_of(pid), unit)


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
    return "pid %d (%s, cgroup %s)" % (pid, comm, cgroup_of(pid) or "?")


def judge(port: int, before: dict, after: dict, main_pid: int, unit: str):
    """None when the answer between the looks `before` and `after` ({inode: uid}) came from the unit whose
    main process is main_pid; else why not: (note, or None when there is nothing to tell a human yet)."""
    if not after:
        return ("nothing listens on port %d after its answer: whoever answered was not %s (a listener held only "
                "for the request)" % (port, unit),)
    if set(before) != set(after):
        return (None,)  # a socket opened (the unit binding as it starts) or closed meanwhile: ask again
    outside = outside_unit(after, main_pid, unit)
    if outside:
        return ("port %d is held by %s, outside the unit (%s)" % (port, outside, unit),)
    return None


def outside_unit(sockets: dict, main_pid: int, unit: str):
    """Who holds one of `sockets` outside the unit, or None when each is the unit's."""
    if not main_pid:
        return None  # no main process to compare with (Type=oneshot): the two looks alone
    group = unit_cgroup(main_pid, unit)
    pids = cgroup_pids(group) if group else None
    left = set(sockets)
    for pid in pids or []:
        held = socket_inodes(pid)
        if held is None:
            pids = None
            break
        left -= held
    if pids is None:  # cannot read the unit's fds: the socket's owner against the unit's user
        user = real_uid(main_pid)
        others = sorted({uid for uid in sockets.values() if uid != user})
        return "a socket of uid %d, not the unit's user (uid %s)" % (others[0], user) if others else None
    if not left:
        return None
    for name in os.listdir("/proc"):  # someone else holds what is left: name it
        if name.isdigit() and int(name) not in pids and (socket_inodes(int(name)) or set()) & left:
            return describe(int(name))
    return "a process this login cannot see"
