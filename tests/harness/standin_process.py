"""The engine stand-in (tests/hosts/engine_standin.py) as a plain local process, for tests of the HTTP exchange
itself: its `misbehave` rules (ROUTE=KIND[:ARG]) make chosen routes answer badly."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.hosts import gpu_state
from tests.hosts._proc import free_port, wait_until

STANDIN = Path(__file__).parents[1] / "hosts" / "engine_standin.py"


class Standin:
    """The SGLang stand-in (memory saver on) as a plain process; its calls recorded in `calls_file`."""

    def __init__(self, tmp: Path, *misbehave: str) -> None:
        self.port = free_port()
        self.calls_file = tmp / f"calls-{self.port}.jsonl"
        gpu = gpu_state.make_state_dir(tmp / f"gpu-{self.port}")
        argv = [sys.executable, str(STANDIN), "--engine", "sglang", "--port", str(self.port), "--gpu-dir", str(gpu),
                "--calls", str(self.calls_file), "--ready-delay", "0", "--memory-saver"]
        self.proc = subprocess.Popen(argv + [f"--misbehave={rule}" for rule in misbehave],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_until(self.serves, timeout=20, what="the stand-in to serve")
        self.calls_file.unlink(missing_ok=True)

    def serves(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def paths(self) -> list[str]:
        text = self.calls_file.read_text() if self.calls_file.exists() else ""
        return [json.loads(line)["path"] for line in text.splitlines()]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
