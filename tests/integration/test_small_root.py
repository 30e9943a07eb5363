"""host.root on a filesystem too small for the payload bundle (or for a job dir): a clean wire error naming
the path, no host traceback, and no temp files left behind. Local transport, a tiny tmpfs (needs root)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.cli_helpers import REPO, Target, run_cli


@pytest.fixture
def tiny_fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "tiny"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k,mode=0700", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def leftovers(root) -> list:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".tmp" in p.name or p.parent.name == "tmp")


def test_a_bundle_that_does_not_fit_is_a_clean_error_and_leaves_no_temp_files(tiny_fs):
    root = tiny_fs / "root"
    target = Target("local", {"address": "local"}, root, {})
    done = run_cli(target, "submit", str(REPO / "jobs" / "demo.yaml"), "--set", f"host.root={root}")
    stderr = done.stderr.decode()
    assert done.returncode not in (0, 2, 3), (done.returncode, stderr)
    assert "Traceback" not in stderr and "No space left" in stderr and str(root) in stderr, stderr
    assert leftovers(root) == [], leftovers(root)


def test_a_job_dir_that_does_not_fit_is_a_clean_error_and_leaves_no_temp_files(tiny_fs, tmp_path):
    """The bundle fits (uploaded to a bigger root, then moved), the job dir's reserve does not."""
    big = tmp_path / "big"
    target = Target("local", {"address": "local"}, big, {})
    done = run_cli(target, "submit", str(REPO / "jobs" / "demo.yaml"), "--set", f"host.root={big}", "--dry-run")
    assert done.returncode == 0, done.stderr.decode()
    subprocess.run(["umount", "-l", str(tiny_fs)], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k,mode=0700", "tmpfs", str(tiny_fs)], check=True)
    root = tiny_fs / "root"
    for cache in list(big.rglob("__pycache__")):  # the host calls' bytecode, where it may be written: not the bundle
        shutil.rmtree(cache)
    subprocess.run(["cp", "-a", str(big), str(root)], check=True)
    filler = tiny_fs / "filler"
    free = os.statvfs(tiny_fs).f_bavail * os.statvfs(tiny_fs).f_frsize
    filler.write_bytes(b"\0" * max(0, free - (64 << 10)))  # leave less than the job dir's reserve
    done = run_cli(target, "submit", str(REPO / "jobs" / "demo.yaml"), "--set", f"host.root={root}")
    stderr = done.stderr.decode()
    assert done.returncode not in (0, 2, 3), (done.returncode, stderr)
    assert "Traceback" not in stderr and "No space left" in stderr, stderr
    assert leftovers(root) == [] and not list((root / "jobs").glob("*")), leftovers(root)
