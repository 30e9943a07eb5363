"""bench_marlin_moe.py refuses bad arguments before importing torch: exit 2 and a message naming the problem."""
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "remote_payload" / "payloads" / "marlin_moe" / "bench_marlin_moe.py"
TINY = ["--experts", "8", "--hidden", "128", "--intermediate", "64", "--topk", "2", "--device", "cpu"]


def bench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, cwd=cwd, timeout=60)


@pytest.mark.parametrize("args, message", [
    (["--batch-sizes", "0,2"], "distinct positive integers"),
    (["--batch-sizes", "1,x"], "comma-separated integers"),
    (["--batch-sizes", "4,4"], "distinct positive integers"),
    (["--batch-sizes", ""], "distinct positive integers"),
    (["--topk", "9"], "--topk 9 is more than --experts 8"),
    (["--hidden", "96"], "--hidden 96 must be a multiple of --group-size 32"),
    (["--intermediate", "160"], "--intermediate 160 must be a multiple"),
    (["--group-size", "48"], "invalid choice"),
    (["--backend", "sglang-kernels"], "needs --device cuda"),
    (["--check"], "needs --device cuda"),
    (["--heartbeat-s", "30"], "--heartbeat-s"),
    (["--prepare-only", "--check"], "cannot be combined with --check"),
    (["--settle-ms", "-1"], "--settle-ms must not be negative"),
    (["--settle", "cool", "--cool-max-ms", "-5"], "--cool-max-ms must not be negative"),
    (["--order", "descending"], "invalid choice"),
])
def test_bad_arguments_exit_2_with_a_clear_message(args, message, tmp_path):
    done = bench(*TINY, *args, "--out", str(tmp_path / "r.json"), cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr
    assert not (tmp_path / "r.json").exists()


def test_check_at_full_k26_scale_is_refused(tmp_path):
    done = bench("--check", "--experts", "384", "--hidden", "7168", "--intermediate", "2048", cwd=tmp_path)
    assert done.returncode == 2
    assert "small shapes" in done.stderr


def test_help_hides_the_test_hooks(tmp_path):
    done = bench("--help", cwd=tmp_path)
    assert done.returncode == 0
    assert "--batch-sizes" in done.stdout
    assert "corrupt" not in done.stdout and "slow-phase" not in done.stdout
