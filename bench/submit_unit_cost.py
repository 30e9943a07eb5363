"""What running the supervisor in a systemd unit costs at submit ("PID 1 as the last line").

On the confined systemd test host: N submits of a tiny job whose service is managed by systemd (nothing is
stopped), once through the fork + guard path (ROOT/launch-fork present) and once through the transient unit;
each `runner submit` is timed end to end (controller, ssh, start, handshake). Prints the medians.

    python -m bench.submit_unit_cost [N]
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

os.environ.setdefault("RUNNER_TEST_SSHD_KEX", "default")  # OpenSSH's own key exchanges (tests/hosts/sshd.py)
from tests.cli_helpers import run_cli, status, wait_terminal
from tests.harness.systemd_jobs import gpu_job, target_for
from tests.hosts._proc import shared_tmpdir
from tests.hosts.systemd_host import start_service_host

FORK_MARKER = "/root/.runner/launch-fork"


def one_submit(host, target, job_file) -> tuple[float, str]:
    t0 = time.monotonic()
    done = run_cli(target, "submit", str(job_file), "--json")
    seconds = time.monotonic() - t0
    assert done.returncode == 0, done.stderr.decode()
    job_id = json.loads(done.stdout)["job_id"]
    wait_terminal(target, job_id)
    return seconds, (status(target, job_id).get("launch") or {}).get("mode", "?")


def main(n: int) -> None:
    host = start_service_host()
    try:
        target = target_for(host)
        results = {}
        for path in ("fork", "systemd-unit"):
            host.ssh(["mkdir", "-p", "/root/.runner"])
            host.ssh(["touch", FORK_MARKER] if path == "fork" else ["rm", "-f", FORK_MARKER], check=True)
            times = []
            for i in range(n + 1):  # the first submit uploads the payload: not counted
                work = shared_tmpdir("runner-bench-unit-")
                seconds, mode = one_submit(host, target, gpu_job(work, host, need=1000, command=["true"]))
                assert mode == path, (mode, path)
                if i:
                    times.append(seconds)
            results[path] = times
            print(f"{path:13s} median {statistics.median(times):.3f} s  "
                  f"(min {min(times):.3f}, max {max(times):.3f}, n={len(times)})", flush=True)
        print(f"unit cost: {statistics.median(results['systemd-unit']) - statistics.median(results['fork']):+.3f} s "
              "per submit (median)")
    finally:
        host.ssh(["rm", "-f", FORK_MARKER])
        host.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
