"""How long `runner list` and `runner tail ID` take from a fresh process, against a baseline checkout and
against `python -c pass` (the interpreter's own start, site and the editable install's finder included).

    python bench/cli_start.py --base /tmp/base [--runs 15] [--out bench/results/cli_start.json]

A loopback sshd, a non-root login; one ended job (its plan cached, the master warm: tail finds no new byte).
Each pair in turn (A B A B …), medians and the per-pair ratios; `python -X importtime` of each command's
`runner.cli.cli` import (the least of 5). Needs root (the sshd's namespaces); removes what it made.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from interleave import FAILURES, REPO, cli, on_user_host, pairs, submit_one


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out", default="bench/results/cli_start.json")
    args = parser.parse_args()
    return on_user_host("runner-bench-cli-", args.out, lambda login, root, work, env: measure(args, login, root, work, env))


def import_ms(checkout: Path, env: dict, *words: str) -> float:
    """runner.cli.cli's cumulative import time, the least of 5 runs."""
    argv, full_env, cwd = cli(checkout, env, *words)
    best = None
    for _ in range(5):
        err = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=full_env, cwd=cwd,
                             capture_output=True).stderr.decode()
        found = re.search(r"\|\s*(\d+) \| runner\.cli\.cli$", err, re.M)
        if found:
            best = min(best or 1e9, int(found.group(1)) / 1000)
    return best


def measure(args, login, root: Path, work: Path, env: dict) -> dict:
    job_id = submit_one(login, root, work, env)
    pass_ = ([sys.executable, "-c", "pass"], None, REPO)
    report = {"job_id": job_id}
    for name, words in (("list", ("list",)), ("tail", ("tail", job_id))):
        report[name] = {"a_vs_b": pairs(cli(REPO, env, *words), cli(args.base, env, *words), args.runs),
                        "a_vs_python_pass": pairs(cli(REPO, env, *words), pass_, args.runs),
                        "b_vs_python_pass": pairs(cli(args.base, env, *words), pass_, args.runs),
                        "import_ms": {"a": import_ms(REPO, env, *words), "b": import_ms(args.base, env, *words)}}
    report["failures"] = FAILURES
    return report


if __name__ == "__main__":
    sys.exit(main())
