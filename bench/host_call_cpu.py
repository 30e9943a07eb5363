"""The CPU one host call costs (`status` of a running job, `logs --stream` of an ended one: what every `runner
status` and `runner tail` makes the host run), against a baseline checkout and `python3 -S -c pass`.

    python bench/host_call_cpu.py --base /tmp/base [--runs 21] [--out bench/results/host_call_cpu.json]

No ssh: two jobs submitted with `host.address: local` into a scratch host.root (one `sleep`, one that ended),
then each checkout's remote_payload/supervisor.py run by `python3 -S` (--python) as BOOT runs it, A and B in
turn, the CPU time (user + sys) of each process from wait4; medians. Then the whole of `runner tail ID` (no new
byte) and `runner status ID` over `address: local` (the CLI and the host call it waits for: no ssh), each
checkout's CLI, against `python -c pass`; medians, and the median of each round's A minus B. With bytecode (as
a host has it beside the bundle). Removes what it made. CPU, not wall: on a shared machine it moves far less
with the load.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from interleave import REPO, cli


def cpu_ms(argv: list[str], stdin: bytes, env: dict, cwd: str | Path = "/") -> float:
    """The process's CPU and its waited-for children's (a local call's host process is one)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, input=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=cwd,
                   check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return 1000 * (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--out", default="bench/results/host_call_cpu.json")
    parser.add_argument("--python", default=os.path.realpath(sys.executable),
                        help="the host's interpreter (default: this one's, not a venv's link nor a pyenv shim)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="runner-bench-hostcpu-"))
    root = work / "root"
    env = {"RUNNER_STATE_DIR": str(work / "state")}
    ids = {}
    try:
        for name, command in (("running", ["sleep", "600"]), ("ended", ["sh", "-c", "echo hello"])):
            spec = work / f"{name}.json"
            spec.write_text(json.dumps({"name": name, "host": {"address": "local", "root": str(root), "python": args.python},
                                        "payload": {"command": command}}))
            argv, full_env, cwd = cli(REPO, env, "submit", str(spec))
            done = subprocess.run(argv, env=full_env, cwd=cwd, capture_output=True, check=True)
            ids[name] = done.stdout.decode().strip()
        time.sleep(2)
        host_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        calls = {
            "status": (["status", "--ids-on-stdin"], json.dumps([ids["running"]]).encode()),
            "logs": (["logs", "--job-id", ids["ended"], "--offset", "0", "--max", str(1 << 20), "--wait", "0.00",
                      "--stream"], b""),
        }
        sides = {"a": REPO, "b": args.base}
        runs: dict[str, list[float]] = {}
        for round_ in range(args.runs + 1):  # round 0 compiles each side's bytecode: not counted
            sample = {"pass": cpu_ms([args.python, "-S", "-c", "pass"], b"", host_env)}
            for verb, (words, stdin) in calls.items():
                for side, checkout in sides.items():
                    script = str(checkout / "remote_payload" / "supervisor.py")
                    sample[f"{verb}_{side}"] = cpu_ms([args.python, "-S", script, *words, "--root", str(root)], stdin,
                                                      host_env)
            sample["cli_python_pass"] = cpu_ms([sys.executable, "-c", "pass"], b"", host_env)
            for verb, words in (("cli_tail", ("tail", ids["ended"])), ("cli_status", ("status", ids["running"]))):
                for side, checkout in sides.items():
                    argv, full_env, cwd = cli(checkout, env, *words)
                    sample[f"{verb}_{side}"] = cpu_ms(argv, b"", full_env, cwd)
            if round_:
                for key, value in sample.items():
                    runs.setdefault(key, []).append(value)
        pairs = {key[:-2]: [a - b for a, b in zip(values, runs[key[:-2] + "_b"])]
                 for key, values in runs.items() if key.endswith("_a")}
        report = {"load": os.getloadavg(), "runs": args.runs, "python": args.python,
                  "median_cpu_ms": {key: round(statistics.median(values), 1) for key, values in runs.items()},
                  # each round's A minus B, the median: the machine's drift (it is shared) moves both sides
                  "median_a_minus_b_ms": {key: round(statistics.median(d), 1) for key, d in pairs.items()}}
        argv, full_env, cwd = cli(REPO, env, "cancel", ids["running"])
        subprocess.run(argv, env=full_env, cwd=cwd, capture_output=True, check=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
