"""`runner tail` as an agent drives it: calls started as processes (some killed by its tool), loops of calls, and
the checks that what the calls that ended by themselves delivered is the host's log exactly once."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

from remote_payload.contract import is_terminal
from tests.cli_helpers import REPO, Target, job_dir, run_cli


def tail_proc(target: Target, job_id: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "runner", "tail", job_id, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, **target.env}, cwd=REPO)


def output_log(target: Target, job_id: str) -> bytes:
    return (job_dir(target, job_id) / "output.log").read_bytes()


def job_ended(target: Target, job_id: str) -> bool:
    try:
        return is_terminal(json.loads((job_dir(target, job_id) / "status.json").read_text())["state"])
    except (OSError, ValueError, KeyError):
        return False


def kill_loop(target: Target, job_id: str, rng: random.Random, rounds: int, wait: tuple[float, float]) -> tuple:
    """`tail -f --max-wait 2` calls until one exits 0, 60 % of them SIGKILLed after a random wait (as an agent's
    tool does). (ended: each ended call's stdout, killed: (bytes the ended calls had delivered before it, its
    stdout) for each killed call)."""
    log_so_far, ended, killed = 0, [], []
    for _ in range(rounds):
        proc = tail_proc(target, job_id, "-f", "--max-wait", "2")
        if rng.random() < 0.6:
            try:
                proc.wait(timeout=rng.uniform(*wait))
            except subprocess.TimeoutExpired:
                # Once the job has ended, a call ends by itself within milliseconds; a kill landing between
                # its cursor save and its exit (the one window this design leaves) would kill a finished call.
                if not job_ended(target, job_id):
                    proc.kill()
        out, err = proc.communicate(timeout=60)
        if proc.returncode < 0:  # killed: an agent's tool threw this output away
            killed.append((log_so_far, out))
            continue
        assert proc.returncode in (0, 75) and b"Traceback" not in err, err.decode()
        ended.append(out)
        log_so_far += len(out)
        if proc.returncode == 0:
            break
    return ended, killed


def tail_loop(target: Target, job_id: str, calls: list, stop=lambda: False) -> None:
    """`tail -f --max-wait 2` calls until one exits 0; each call's (exit code, stdout) appended to `calls`."""
    while not stop():
        done = run_cli(target, "tail", job_id, "-f", "--max-wait", "2", timeout=60)
        assert done.returncode in (0, 75) and b"Traceback" not in done.stderr, done.stderr.decode()
        calls.append((done.returncode, done.stdout))
        if done.returncode == 0:
            return


def tile_the_log(log: bytes, pieces: list[bytes]) -> bool:
    """Are the non-empty pieces slices of the log that, put end to end, give it exactly once?"""
    rest, pos = [p for p in pieces if p], 0
    while rest:
        piece = next((p for p in rest if log.startswith(p, pos)), None)
        if piece is None:
            return False
        rest.remove(piece)
        pos += len(piece)
    return pos == len(log)
