"""A fleet submit and status against Ansible's own fan-out, on N loopback hosts (a real sshd each).

Each host is a test sshd (tests/hosts/sshd.py: its own port, PID and mount namespace); one ssh_config names
them fleet-1 … fleet-N. Per N, interleaved rounds of:

    runner submit FLEET.yaml --forks N   a fleet of N (max_unavailable N, no service, payload `true`)
    runner submit FLEET.yaml             the same with the default forks (only where N > the default)
    runner status RUN                    that run, every host asked
    ansible all -m ping -f N             the same hosts through the same ssh_config

each timed end to end as a separate process (warm: the first round of each is not counted, so every tool
has its own ControlMaster connections open, as in a working session). Medians go to
bench/results/fleet_fanout.json with the load average beside each.

    python -m bench.fleet_fanout [N ...] [--rounds R] [--ansible /work/venv-ansible/bin/ansible]
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

import yaml

from runner.state.fleet_store import DEFAULT_FORKS
os.environ.setdefault("RUNNER_TEST_SSHD_KEX", "default")  # OpenSSH's own key exchanges (tests/hosts/sshd.py)
from tests.hosts._proc import shared_tmpdir
from tests.hosts.sshd import start_sshd

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "fleet_fanout.json"
ANSIBLE = "/work/venv-ansible/bin/ansible"


def start_hosts(n: int) -> list:
    """n test sshd, started from this thread: each dies with the thread that started it (PR_SET_PDEATHSIG)."""
    hosts = []
    try:
        for _ in range(n):
            hosts.append(start_sshd())
    except BaseException:
        for host in hosts:
            host.stop()
        raise
    return hosts


def aliases(n: int) -> list[str]:
    return [f"fleet-{i + 1}" for i in range(n)]


def write_ssh_config(hosts, work: Path) -> Path:
    """One ssh_config naming host i `fleet-i` (each host's own block for root, renamed)."""
    blocks = [host.ssh_config.read_text().split("\n\n")[0].replace("Host testhost", f"Host {alias}", 1)
              for alias, host in zip(aliases(len(hosts)), hosts)]
    config = work / "ssh_config"
    config.write_text("\n\n".join(blocks) + "\n")
    return config


def write_fleet_spec(n: int, work: Path) -> Path:
    spec = {"name": "fanout", "host": {"address": aliases(n)}, "service": {"manager": "none"},
            "payload": {"command": ["true"]}, "limits": {"max_runtime": "1m", "grace": "2s"},
            "rollout": {"max_unavailable": n}}
    path = work / "fleet.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def write_inventory(n: int, work: Path, config: Path) -> Path:
    """Ansible's inventory: the same aliases, through the same ssh_config."""
    lines = ["[fleet]", *aliases(n), "", "[fleet:vars]", "ansible_python_interpreter=/usr/bin/python3",
             f"ansible_ssh_common_args='-F {config}'", ""]
    path = work / "inventory.ini"
    path.write_text("\n".join(lines))
    return path


def timed(argv: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    began = time.monotonic()
    done = subprocess.run(argv, capture_output=True, env=env, cwd=REPO, timeout=600)
    return time.monotonic() - began, done


def submit(runner: list[str], spec: Path, env: dict, *args: str) -> tuple[float, dict]:
    seconds, done = timed([*runner, "submit", str(spec), "--json", "--max-wait", "120", *args], env)
    run = json.loads(done.stdout)
    assert done.returncode == 0 and run["state"] == "SUCCEEDED", (done.returncode, done.stdout[-2000:],
                                                                 done.stderr[-2000:])
    return seconds, run


def load() -> float:
    return os.getloadavg()[0]


def bench_n(n: int, rounds: int, ansible: str) -> dict:
    hosts = start_hosts(n)
    try:
        work = shared_tmpdir("runner-bench-fanout-")
        config = write_ssh_config(hosts, work)
        spec = write_fleet_spec(n, work)
        inventory = write_inventory(n, work, config)
        env = {**os.environ, "RUNNER_SSH_CONFIG": str(config), "RUNNER_STATE_DIR": str(work / "state"),
               "ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_LOCAL_TEMP": str(work / "ansible-tmp"),
               "ANSIBLE_SSH_CONTROL_PATH_DIR": str(work / "ansible-cp")}
        runner = [sys.executable, "-m", "runner"]
        rows: dict[str, list] = {"submit": [], "status": [], "ansible_ping": []}
        first: dict[str, float] = {}  # round 0: each tool's first contact (new masters, the payload uploaded)
        if n > DEFAULT_FORKS:
            rows["submit_default_forks"] = []
        for round_ in range(rounds + 1):
            if "submit_default_forks" in rows:
                default_s, run = submit(runner, spec, env)
                if round_:
                    rows["submit_default_forks"].append([default_s, load()])
                else:
                    first["submit_default_forks"] = round(default_s, 2)
            seconds, run = submit(runner, spec, env, "--forks", str(n))
            submit_load = load()
            status_s, shown = timed([*runner, "status", run["run_id"]], env)
            assert shown.returncode == 0, shown.stdout.decode()[-2000:]
            status_load = load()
            ping_s, ping = timed([ansible, "all", "-i", str(inventory), "-m", "ping", "-f", str(n)], env)
            assert ping.returncode == 0 and ping.stdout.count(b"SUCCESS") == n, ping.stdout.decode()[-2000:]
            ping_load = load()
            default = f"submit (default forks) {default_s:.2f} s, " if n > DEFAULT_FORKS else ""
            print(f"N={n} round {round_}: {default}"
                  + f"submit {seconds:.2f} s (load {submit_load:.2f}), status {status_s:.2f} s "
                  f"(load {status_load:.2f}), ansible ping {ping_s:.2f} s (load {ping_load:.2f})"
                  + ("  [warm-up, not counted]" if round_ == 0 else ""), flush=True)
            if round_:
                rows["submit"].append([seconds, submit_load])
                rows["status"].append([status_s, status_load])
                rows["ansible_ping"].append([ping_s, ping_load])
            else:
                first.update(submit=round(seconds, 2), status=round(status_s, 2), ansible_ping=round(ping_s, 2))
        return {name: {"median_s": round(statistics.median(s for s, _ in values), 2),
                       "min_s": round(min(s for s, _ in values), 2), "max_s": round(max(s for s, _ in values), 2),
                       "load_1min": [round(l, 2) for _, l in values], "runs_s": [round(s, 2) for s, _ in values],
                       "first_round_s": first[name]}
                for name, values in rows.items()}
    finally:
        for host in hosts:
            host.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="*", type=int, default=[8, 24])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ansible", default=ANSIBLE)
    args = parser.parse_args()
    version = subprocess.run([args.ansible, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    document = {"what": "runner submit --forks N (fleet, max_unavailable N, no service, payload `true`; "
                        "submit_default_forks: without --forks) and runner status RUN vs `ansible all -m ping -f N`, "
                        "same hosts, interleaved, warm (first_round_s: each tool's first contact), medians",
                "ansible": version, "cpus": os.cpu_count(), "rounds": args.rounds, "by_n": {}}
    for n in args.n:
        document["by_n"][str(n)] = found = bench_n(n, args.rounds, args.ansible)
        ping = found["ansible_ping"]["median_s"]
        found["ratio_to_ansible"] = {k: round(found[k]["median_s"] / ping, 2) for k in found if k != "ansible_ping"}
        print(f"N={n}: {json.dumps(found['ratio_to_ansible'])}", flush=True)
        RESULTS.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
