"""How slow this machine is right now, for bounds that prove "does not block".

A fixed number of seconds fails on a loaded machine (a CI box running beside other work) for no fault of the
code. `pace()` times a reference task at the test's start — a fresh interpreter importing the CLI, what every
`runner` command and every host call pays — and returns its wall time over the CPU time it used: about 1 on
a quiet machine, the share of a core it could get otherwise. `scaled(seconds)` multiplies a bound by it. A
test scales both sides of what it proves (the bound, and the payload's length it must stay under), so the
proof keeps its margin whatever the load.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_PACE = 20.0  # past it the machine is too loaded to test on; bounds stop growing
MIN_CPU_S = 0.02  # the reference's CPU time is never measured as less (a clock's granularity)


def pace() -> float:
    """The machine's slowdown now: the reference task's wall time over its CPU time, from 1 to MAX_PACE."""
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", "import runner.cli.cli"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - began
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, "the reference task failed: `python -c 'import runner.cli.cli'`"
    cpu = max(MIN_CPU_S, usage.ru_utime + usage.ru_stime)
    return min(MAX_PACE, max(1.0, wall / cpu))


class Scale:
    """Bounds of one test, scaled by the pace measured when it is made (at the test's start)."""

    def __init__(self) -> None:
        self.factor = pace()

    def __call__(self, seconds: float) -> float:
        return seconds * self.factor

    def __repr__(self) -> str:
        return f"Scale(×{self.factor:.1f})"
