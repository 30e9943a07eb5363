"""A payload whose import closure is large: its submit unchanged and changed, the code under test (A) against a
baseline checkout (B), the nohup line, and `tar c … | ssh host tar x` + the nohup line.

    python bench/bundle_submit.py --base /tmp/base [--mib 100] [--modules 12] [--runs 7] [--changed-runs 5]
        [--sides ab] [--out bench/results/bundle_submit.json]

A loopback sshd, a non-root login (OpenSSH transport, master warm), a ROOT per side. The payload: a script
that imports --modules modules of its own folder (inside a function it never calls: the closure counts them,
the host never runs them), --mib MiB of Python source in all (each module a few functions and string
constants of random hex). 1. Unchanged (with a control: A's submit of a script that imports nothing): `runner submit JOB.json` with the job's name changed before each run
(the closure as it was), A, B and `ssh HOST 'nohup … & echo $!'` (a fresh connection, as a user types it) in
turn. 2. Changed: every module rewritten (new random constants, the same size) before each of A and B, and
for the third side a fresh dir of the same size sent by `tar c -C DIR . | ssh HOST 'mkdir D && tar x -C D'`
and then the nohup line; the throughput ratio is (tar + nohup) / runner. B runs in its own process
(RUNNER_RESIDENT=0: no warm server of its own). Needs root (the sshd's namespaces); removes what it made.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

from interleave import FAILURES, REPO, cli, on_user_host, summary, timed

NOHUP = "nohup sleep 1 >/dev/null 2>&1 </dev/null & echo $!"


def write_module(path: Path, size: int, index: int) -> None:
    """About `size` bytes of Python: small functions and 64-character hex constants, new random ones each time."""
    lines, written, n = [f'"""Module {index} of a large payload."""\n', "import os\n\n"], 0, 0
    while written < size:
        if n % 8 == 0:
            line = f"\ndef f_{n}(x):\n    return x * {n} + len(os.sep)\n\n"
        else:
            line = f'C_{n} = "{secrets.token_hex(32)}"\n'
        lines.append(line)
        written += len(line)
        n += 1
    path.write_text("".join(lines))


def write_payload(folder: Path, mib: int, modules: int) -> None:
    folder.mkdir(exist_ok=True)
    each = (mib << 20) // modules
    for i in range(modules):
        write_module(folder / f"big_{i:02d}.py", each, i)
    imports = "".join(f"    import big_{i:02d}  # noqa: F401\n" for i in range(modules))
    (folder / "job.py").write_text(f"import sys\n\n\ndef _never_called():\n{imports}\n\nprint('ran', sys.argv[1:])\n")


def write_spec(payload: Path, login, root: Path, name: str) -> Path:
    """JOB.json beside the script (payload.script is relative to the job file)."""
    path = payload / "JOB.json"
    path.write_text(json.dumps({"name": name, "host": {"address": login.alias, "root": str(root),
                                                       "transport": "openssh"},
                                "service": {"manager": "none"},
                                "payload": {"script": "job.py"}, "limits": {"max_runtime": "5m"}}))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--modules", type=int, default=12)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--changed-runs", type=int, default=5)
    parser.add_argument("--sides", default="ab", help="which of A (this checkout) and B (--base) run")
    parser.add_argument("--base-runs", type=int, default=None, help="B in the first N rounds only (default: all; "
                        "B computes a large closure for a minute a submit)")
    parser.add_argument("--out", default="bench/results/bundle_submit.json")
    args = parser.parse_args()

    def measure(login, root, work, env) -> dict:
        roots = {}
        for side in args.sides:
            roots[side] = root / side
            roots[side].mkdir()
            subprocess.run(["chown", login.user, str(roots[side])], check=True)
        payloads = {side: work / f"payload-{side}" for side in args.sides}
        for folder in payloads.values():
            write_payload(folder, args.mib, args.modules)
        if "a" in args.sides:  # the control: the same submit of a script that imports nothing
            roots["a0"], payloads["a0"] = roots["a"], work / "payload-a0"
            write_payload(payloads["a0"], 0, 1)
        subprocess.run(["chmod", "-R", "a+rX", str(work)], check=True)
        report = {"mib": args.mib, "modules": args.modules, "load_start": os.getloadavg()}
        report["unchanged"] = unchanged(args, login, roots, payloads, work, env)
        report["changed"] = changed(args, login, roots, payloads, work, env)
        report.update(load_end=os.getloadavg(), failures=FAILURES)
        return report

    return on_user_host("runner-bench-bundle-", args.out, measure)


def _sides(args, env: dict) -> dict:
    checkouts = {"a": REPO, "b": args.base}
    envs = {"a": env, "b": dict(env, RUNNER_RESIDENT="0")}
    return {side: (checkouts[side], envs[side]) for side in args.sides}


def unchanged(args, login, roots: dict, payloads: dict, work: Path, env: dict) -> dict:
    sides = _sides(args, env)
    if "a" in sides:
        sides["a0"] = sides["a"]
    nohup = (["ssh", "-F", str(login.ssh_config), login.alias, NOHUP], None, REPO)
    walls: dict[str, list[float]] = {side: [] for side in (*sides, "nohup")}
    for i in range(-2, args.runs):  # < 0: the first upload of each side's bundles and its master, untimed
        for side, (checkout, side_env) in sides.items():
            if side == "b" and i >= _base_runs(args):
                continue
            spec = write_spec(payloads[side], login, roots[side], f"unchanged-{side}-{i}")
            wall, _ = timed(*cli(checkout, side_env, "submit", str(spec)))
            if i >= 0:
                walls[side].append(wall)
        wall, _ = timed(*nohup)
        if i >= 0:
            walls["nohup"].append(wall)
    return {"s": {k: summary(v) for k, v in walls.items()},
            **{f"ratio_{side}_over_nohup": _ratio(walls[side], walls["nohup"]) for side in sides},
            "load": os.getloadavg()}


def changed(args, login, roots: dict, payloads: dict, work: Path, env: dict) -> dict:
    sides = _sides(args, env)
    ssh = ["ssh", "-F", str(login.ssh_config), login.alias]
    walls: dict[str, list[float]] = {side: [] for side in (*sides, "tar_ssh_nohup")}
    fresh = work / "tar-src"
    for i in range(-1, args.changed_runs):  # -1: untimed
        for side, (checkout, side_env) in sides.items():
            if side == "b" and i >= _base_runs(args):
                continue
            write_payload(payloads[side], args.mib, args.modules)
            subprocess.run(["chmod", "-R", "a+rX", str(payloads[side])], check=True)
            spec = write_spec(payloads[side], login, roots[side], f"changed-{side}-{i}")
            wall, _ = timed(*cli(checkout, side_env, "submit", str(spec)))
            if i >= 0:
                walls[side].append(wall)
        write_payload(fresh, args.mib, args.modules)
        dest = f"tar-{i + 1}-{secrets.token_hex(4)}"
        t0 = time.monotonic()
        subprocess.run(f"tar c -C {fresh} . | {' '.join(ssh)} 'mkdir {dest} && tar x -C {dest}'", shell=True,
                       check=True)
        subprocess.run([*ssh, NOHUP], check=True, capture_output=True)
        if i >= 0:
            walls["tar_ssh_nohup"].append(time.monotonic() - t0)
        subprocess.run([*ssh, f"rm -rf {dest}"], check=True)
    return {"s": {k: summary(v) for k, v in walls.items()},
            **{f"throughput_{side}_over_tar_ssh": _ratio(walls["tar_ssh_nohup"], walls[side]) for side in sides},
            "load": os.getloadavg()}


def _base_runs(args) -> int:
    return args.runs if args.base_runs is None else args.base_runs


def _ratio(xs: list[float], ys: list[float]) -> float:
    return round(statistics.median(x / y for x, y in zip(xs, ys)), 3)


if __name__ == "__main__":
    sys.exit(main())
