"""Pure parsers of what external commands print (nvidia-smi, `systemctl show`, sudo) and of /proc's text; the
tests feed them captured output.
"""
from __future__ import annotations

import re

LISTEN = "0A"  # the TCP state column of a listening socket (include/net/tcp_states.h: TCP_LISTEN = 10)
NOT_A_NUMBER = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", "")


def parse_mib(text: str):
    """An nvidia-smi memory cell in MiB; None for "[N/A]", "[Not Supported]" and the like."""
    text = text.strip()
    if text in NOT_A_NUMBER:
        return None
    try:
        return int(float(text))
    except ValueError:  # other bracketed words, e.g. "[Insufficient Permissions]" inside some containers
        return None


def parse_gpu_csv(text: str) -> list:
    """`--query-gpu=index,uuid,name,memory.total,memory.used,memory.free --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = line.split(",")
        if len(cells) < 6:
            raise ValueError("nvidia-smi line has %d fields, expected 6: %r" % (len(cells), line))
        total, used, free = (parse_mib(c) for c in cells[-3:])
        if free is None and total is not None and used is not None:
            free = total - used
        gpus.append({"index": cells[0].strip(), "uuid": cells[1].strip(), "name": ",".join(cells[2:-3]).strip(),
                     "total_mib": total, "used_mib": used, "free_mib": free})
    return gpus


def parse_apps_csv(text: str) -> list:
    """`--query-compute-apps=pid,used_memory --format=csv,noheader,nounits`."""
    apps = []
    for line in text.splitlines():
        if line.strip():
            pid, mib = line.split(",", 1)
            apps.append({"pid": int(pid.strip()), "used_mib": parse_mib(mib)})
    return apps


def parse_systemctl_show(text: str) -> dict:
    """`systemctl show --property=ActiveState,SubState,MainPID UNIT`: KEY=VALUE lines (any order)."""
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    main_pid = values.get("MainPID", "0").strip()
    return {"active_state": values.get("ActiveState", "").strip() or "unknown",
            "sub_state": values.get("SubState", "").strip() or "unknown",
            "main_pid": int(main_pid) if main_pid.isdigit() else 0}


def sudo_wants_password(returncode: int, stderr: str) -> bool:
    return "password is required" in stderr or (returncode == 1 and stderr.lstrip().startswith("sudo:"))


def parse_listeners(text: str) -> dict:
    """{port: {inode: uid, ...}} of the listening sockets in a /proc/net/tcp or tcp6 table (uid: the socket's
    owner, the user of the process that made it)."""
    found = {}  # type: dict
    for line in text.splitlines()[1:]:
        cells = line.split()
        if len(cells) < 10 or cells[3] != LISTEN:
            continue
        try:
            port = int(cells[1].rsplit(":", 1)[1], 16)
            uid, inode = int(cells[7]), int(cells[9])
        except (IndexError, ValueError):
            continue
        if inode:
            found.setdefault(port, {})[inode] = uid
    return found


def parse_mount_points(text: str) -> list:
    """The mount points of a /proc/PID/mountinfo text (its fifth field; a space, tab, newline or backslash in
    a path is written as an octal escape: \\040 and the like)."""
    points = []
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def parse_cgroup(text: str):
    """The cgroup v2 path of a /proc/PID/cgroup text ("0::/system.slice/x.service"), None without one."""
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip()
    return None
