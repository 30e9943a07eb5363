#!/usr/bin/env python3
"""A connection-recording ssh ProxyCommand, so a test can prove that the controller never reached a host.

    ProxyCommand python3 recording.py LOG %h %p

Each connection attempt appends one line to LOG *before* anything is sent, then relays bytes between
stdin/stdout and HOST:PORT. The controller (fabric/paramiko) and the OpenSSH client both honour
ProxyCommand from ssh_config, so an empty LOG means no SSH connection was opened, hence no remote command
ran. `recording_ssh_config` writes a copy of a test host's ssh_config whose aliases go through it.
Stdlib only: it runs as its own process, started by the SSH client.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def recording_ssh_config(ssh_config: Path, log: Path, out: Path) -> Path:
    """Copy `ssh_config` to `out`, adding to every Host block a ProxyCommand that records into `log`."""
    proxy = f"    ProxyCommand {sys.executable} {HERE} {log} %h %p"
    text = re.sub(r"^(Host .*)$", lambda m: m.group(1) + "\n" + proxy, ssh_config.read_text(), flags=re.M)
    out.write_text(text)
    return out


def connection_attempts(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def relay_stdin_to(sock: socket.socket) -> None:
    while True:
        data = os.read(0, 65536)
        if not data:
            break
        sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)


def main(argv: list[str]) -> int:
    log, host, port = argv
    with open(log, "a") as fh:
        fh.write(f"{time.time():.3f} {host}:{port}\n")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.settimeout(None)
    threading.Thread(target=relay_stdin_to, args=(sock,), daemon=True).start()
    while True:
        data = sock.recv(65536)
        if not data:
            return 0
        os.write(1, data)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
