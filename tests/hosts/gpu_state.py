"""The state dir the nvidia-smi stand-in (tests/hosts/bin/nvidia-smi, a test fake) reads.

Layout: gpus.json — [{index, uuid, name, total_mib, baseline_used_mib}] — and apps/<pid> files holding
"<pid>,<MiB>" written by processes that "hold" GPU memory while they live.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

STANDIN = Path(__file__).parent / "bin" / "nvidia-smi"
# Where the hosts bind-mount the state dir inside their private /run; the stand-in's default.
STATE_DIR_IN_HOST = "/run/runner-fake-gpu"
H200_TOTAL_MIB = 143771


def write_gpus(state_dir: Path, total_mib: int = H200_TOTAL_MIB, baseline_used: int = 0, count: int = 1) -> None:
    """(Re)write the cards; replaced atomically so a concurrent stand-in never reads half a file."""
    gpus = [{"index": index, "uuid": f"GPU-00000000-0000-4000-8000-{index:012d}", "name": "NVIDIA H200",
             "total_mib": total_mib, "baseline_used_mib": baseline_used} for index in range(count)]
    tmp = state_dir / "gpus.json.tmp"
    tmp.write_text(json.dumps(gpus))
    os.replace(tmp, state_dir / "gpus.json")


def make_state_dir(state_dir: Path) -> Path:
    """A state dir every local user may add apps files to (a payload may run as a non-root login)."""
    apps = state_dir / "apps"
    apps.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o755)
    apps.chmod(0o1777)
    write_gpus(state_dir)
    return state_dir
