"""Do back-to-back SSH commands on one controller connection stall? (Nagle's algorithm + delayed ACK)

    python bench/nodelay_check.py        (root: starts its own loopback sshd, stops it at the end)

Runs `true` back to back over one runner.remote.transport.SshTransport, then sets TCP_NODELAY on that
connection's socket and runs it again. Exits 1 while the first median is more than twice the second
plus 10 ms: then each command after the first waits for the server's delayed ACK (40 ms on Linux)
before its channel-open packet leaves. docs/performance.md, "Findings", has the numbers and the fix.
"""
from __future__ import annotations

import os
import socket
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runner.deadline import Deadline  # noqa: E402
from runner.remote.transport import SshTarget, SshTransport  # noqa: E402
os.environ.setdefault("RUNNER_TEST_SSHD_KEX", "default")  # OpenSSH's own key exchanges (tests/hosts/sshd.py)
from tests.hosts import sshd  # noqa: E402

RUNS = 20


def median_command_seconds(transport: SshTransport) -> float:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        transport.run(["true"], deadline=Deadline(30))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    host = sshd.start_sshd()
    try:
        os.environ["RUNNER_SSH_CONFIG"] = str(host.ssh_config)
        # the non-root login: Debian's default ~/.bashrc, so the shell's start-up does not hide the stall
        transport = SshTransport(SshTarget(address=host.as_user(sshd.NON_ROOT_USER).alias))
        try:
            transport.run(["true"], deadline=Deadline(30))  # connects
            as_is = median_command_seconds(transport)
            sock = transport._conn.transport.sock  # reaching in on purpose: this is the setting under test
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            no_delay = median_command_seconds(transport)
        finally:
            transport.close()
    finally:
        host.stop()
    print(f"back-to-back `true` on one connection: {as_is * 1000:.1f} ms as the controller leaves it, "
          f"{no_delay * 1000:.1f} ms with TCP_NODELAY (median of {RUNS})")
    stalls = as_is > 2 * no_delay + 0.010
    print("STALL: the controller's socket leaves Nagle on" if stalls else "no stall")
    return 1 if stalls else 0


if __name__ == "__main__":
    sys.exit(main())
