#!/usr/bin/env python3
"""TEST PAYLOAD for the nvidia-smi stand-in: "hold" MIB of GPU memory for SECONDS, then release it.

    python3 hold_gpu.py MIB SECONDS [GPU_INDEX]

While it lives, the stand-in counts `<state dir>/apps/<pid>` = "<pid>,<MIB>,<GPU_INDEX>". SIGTERM/SIGINT
release at once (exit 143/130, like a killed process); stdlib only so it can run as an uploaded payload.
"""

import os
import signal
import sys
import time
from pathlib import Path


def apps_file() -> Path:
    state_dir = Path(os.environ.get("RUNNER_FAKE_GPU_DIR") or "/run/runner-fake-gpu")
    return state_dir / "apps" / str(os.getpid())


def exit_on_signal(signum, _frame):
    raise SystemExit(128 + signum)


def main(argv: list[str]) -> int:
    mib, seconds = int(argv[0]), float(argv[1])
    gpu_index = int(argv[2]) if len(argv) > 2 else 0
    signal.signal(signal.SIGTERM, exit_on_signal)
    signal.signal(signal.SIGINT, exit_on_signal)
    path = apps_file()
    path.write_text(f"{os.getpid()},{mib},{gpu_index}")
    print(f"holding {mib} MiB on GPU {gpu_index} for {seconds} s", flush=True)
    try:
        time.sleep(seconds)
    finally:
        path.unlink(missing_ok=True)
    print("released", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
