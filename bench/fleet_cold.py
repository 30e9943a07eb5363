"""A cold fleet: `runner submit` driving a rollout on N fresh loopback hosts to its end, against `ansible all -m
shell -a '<the same payload>' -f N`, and against a baseline checkout of runner.

    python bench/fleet_cold.py --base /tmp/base [--hosts 24] [--rounds 3] [--payload 'sleep 3']
        [--ansible build/ansible-venv/bin/ansible] [--out bench/results/fleet_cold.json]

N test sshd (tests/hosts/sshd.py, each its own port, namespaces, root login (a private /root) and non-root login;
every alias `fleet-i` pinned to 127.0.0.1), one ssh_config naming their root logins (--login user: the non-root).
Each round, in turn: the code under test (A), the baseline (B), Ansible (C), each cold: a state dir (so no master, no cached plan) and a host root
(`~/cold-<side><round>`, in each login's own home: no bundle on the host) never used before, and for Ansible a
ControlPath dir never used before. A and B: `runner submit FLEET.json --json --max-wait 600 --forks N` of a fleet
(service none, max_unavailable N, payload `sh -c PAYLOAD`) until it exits with every host SUCCEEDED; C: every
host's `sh -c PAYLOAD` answered. Medians, the per-round ratios, the load average beside each. Needs root (the
sshds' namespaces, the logins); removes what it made.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from interleave import REPO, cli, start_hosts, summary

from tests.hosts._proc import shared_tmpdir  # noqa: E402
from tests.hosts.sshd import ROOT_ALIAS, alias_for  # noqa: E402


def write_ssh_config(hosts: list, work: Path, login: str) -> Path:
    """Host i's root or non-root login as `fleet-i` (its own block: HostName 127.0.0.1, port, key, known_hosts)."""
    blocks = []
    for i, host in enumerate(hosts):
        alias = ROOT_ALIAS if login == "root" else alias_for(host.non_root_user)
        block = next(b for b in host.ssh_config.read_text().split("\n\n") if b.startswith(f"Host {alias}\n"))
        assert "HostName 127.0.0.1" in block
        blocks.append(block.replace(f"Host {alias}\n", f"Host fleet-{i + 1}\n", 1))
    config = work / "ssh_config"
    config.write_text("\n\n".join(blocks) + "\n")
    return config


def fleet_spec(n: int, work: Path, root: str, payload: str) -> Path:
    spec = {"name": "cold", "host": {"address": [f"fleet-{i + 1}" for i in range(n)], "root": root},
            "service": {"manager": "none"}, "payload": {"command": ["sh", "-c", payload]},
            "limits": {"max_runtime": "5m", "grace": "2s"}, "rollout": {"max_unavailable": n}}
    path = work / f"fleet-{root.strip('~/')}.json"
    path.write_text(json.dumps(spec))
    return path


def run_runner(checkout: Path, n: int, work: Path, config: Path, side: str, round_: int, payload: str) -> dict:
    spec = fleet_spec(n, work, f"~/cold-{side}{round_}", payload)
    env = {"RUNNER_SSH_CONFIG": str(config), "RUNNER_STATE_DIR": str(work / f"state-{side}{round_}")}
    argv, full_env, cwd = cli(checkout, env, "submit", str(spec), "--json", "--max-wait", "600", "--forks", str(n))
    began = time.monotonic()
    done = subprocess.run(argv, env=full_env, cwd=cwd, capture_output=True, timeout=900)
    wall = time.monotonic() - began
    try:
        run = json.loads(done.stdout)
    except ValueError:
        run = {}
    states = [h.get("state") for h in run.get("hosts", [])]
    ok = done.returncode == 0 and states.count("SUCCEEDED") == n
    return {"s": round(wall, 3), "ok": ok, "exit": done.returncode, "load": os.getloadavg(),
            **({} if ok else {"stdout": done.stdout.decode()[-1500:], "stderr": done.stderr.decode()[-1500:]})}


def run_ansible(ansible: str, n: int, work: Path, config: Path, round_: int, payload: str) -> dict:
    inventory = work / "inventory.ini"
    inventory.write_text("\n".join(["[fleet]", *(f"fleet-{i + 1}" for i in range(n)), "", "[fleet:vars]",
                                    "ansible_python_interpreter=/usr/bin/python3",
                                    f"ansible_ssh_common_args='-F {config}'", ""]))
    env = {**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_LOCAL_TEMP": str(work / f"atmp-{round_}"),
           "ANSIBLE_SSH_CONTROL_PATH_DIR": str(work / f"acp-{round_}")}
    began = time.monotonic()
    done = subprocess.run([ansible, "all", "-i", str(inventory), "-m", "shell", "-a", payload, "-f", str(n)],
                          env=env, capture_output=True, timeout=900)
    wall = time.monotonic() - began
    ok = done.returncode == 0 and done.stdout.count(b"CHANGED") == n
    return {"s": round(wall, 3), "ok": ok, "exit": done.returncode, "load": os.getloadavg(),
            **({} if ok else {"stdout": done.stdout.decode()[-1500:]})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--hosts", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--payload", default="sleep 3")
    parser.add_argument("--ansible", default=str(REPO / "build" / "ansible-venv" / "bin" / "ansible"))
    parser.add_argument("--sides", default="abc", help="which of A (this checkout), B (--base), C (Ansible) run")
    parser.add_argument("--login", choices=("root", "user"), default="root", help="each host's root login (the "
                        "measure of a fleet submit), or its non-root one")
    parser.add_argument("--out", default="bench/results/fleet_cold.json")
    args = parser.parse_args()
    hosts = start_hosts(args.hosts)
    work = shared_tmpdir("runner-bench-cold-")
    rows: dict[str, list] = {side: [] for side in args.sides}
    try:
        config = write_ssh_config(hosts, work, args.login)
        report = {"hosts": args.hosts, "payload": args.payload, "login": args.login, "load_start": os.getloadavg(),
                  "ansible": subprocess.run([args.ansible, "--version"], capture_output=True,
                                            text=True).stdout.splitlines()[0]}
        for round_ in range(args.rounds):
            for side in args.sides:
                if side == "c":
                    row = run_ansible(args.ansible, args.hosts, work, config, round_, args.payload)
                else:
                    checkout = REPO if side == "a" else args.base
                    row = run_runner(checkout, args.hosts, work, config, side, round_, args.payload)
                rows[side].append(row)
                print(f"round {round_} {side}: {row['s']:.2f} s ok={row['ok']} load {row['load'][0]:.1f}",
                      flush=True)
        report["runs"] = rows
        report["s"] = {side: summary([r["s"] for r in got]) for side, got in rows.items()}
        for x, y in (("a", "c"), ("b", "c"), ("a", "b")):
            if x in rows and y in rows:
                report[f"ratio_{x}_over_{y}"] = round(statistics.median(
                    p["s"] / q["s"] for p, q in zip(rows[x], rows[y])), 3)
        report["load_end"] = os.getloadavg()
    finally:
        for host in hosts:
            host.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
