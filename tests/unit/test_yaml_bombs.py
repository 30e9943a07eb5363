"""A small YAML file whose aliases expand to billions of values (a "billion laughs" bomb), in a job file or in
a `--set` value, is refused in a moment with exit 2, in bounded memory: the loader counts what aliases
expand to before anything walks the value, and no message ever repr()s an unbounded value."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.errors import SpecError
from runner.spec.spec_fields import short
from runner.spec.spec_load import load_spec

REPO = Path(__file__).resolve().parents[2]
HEAD = "name: bomb\nhost: {address: local}\npayload: {command: ['true']}\n"
MEMORY_CAP = 1 << 30  # the CLI under test gets 1 GiB of address space: an expanding repr dies fast


def bomb(levels: int = 9, width: int = 9) -> str:
    """A flow list of `levels` anchored lists, each `width` aliases of the one before: width**levels leaves."""
    parts = [f"&l0 [{','.join(['lol'] * width)}]"]
    parts += [f"&l{k} [{','.join([f'*l{k - 1}'] * width)}]" for k in range(1, levels)]
    return f"[{', '.join(parts)}]"


FIELDS = {
    "gpu.min_free_mib": HEAD + "gpu: {min_free_mib: %s}\n",
    "service.unit": HEAD.replace("name: bomb\n", "name: bomb\nservice: {manager: systemd, unit: %s}\n"),
    "gpu.devices": HEAD + "gpu: {devices: %s}\n",
}


def test_the_bomb_is_small():
    assert len(FIELDS["gpu.min_free_mib"] % bomb()) < 500


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_a_bomb_in_a_field_is_refused_at_once(tmp_path, field):
    path = tmp_path / "bomb.yaml"
    path.write_text(FIELDS[field] % bomb())
    started = time.monotonic()
    with pytest.raises(SpecError, match="expands to more than"):
        load_spec(path)
    assert time.monotonic() - started < 5


def test_a_bomb_in_a_set_value_is_refused_at_once(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(HEAD)
    started = time.monotonic()
    with pytest.raises(SpecError, match=r"--set .*expands to more than"):
        load_spec(path, [f"gpu.min_free_mib={bomb()}"])
    assert time.monotonic() - started < 5


def test_a_recursive_alias_is_refused(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text(HEAD + "gpu: {devices: &d [0, *d]}\n")
    with pytest.raises(SpecError, match="refers to itself"):
        load_spec(path)


def test_aliases_that_expand_a_little_still_work(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: m\nhost: {address: local}\npayload:\n  script: x.py\n"
                    "  env: &base {A: '1', B: '2'}\n  args: {<<: *base, A: 3}\n")
    assert load_spec(path).payload.args == {"A": 3, "B": "2"}


def test_short_is_bounded_whatever_the_value():
    wide = [0] * 10_000_000
    shared = [wide] * 1000
    started = time.monotonic()
    text = short([shared, "x" * 10_000_000, {i: i for i in range(10_000)}])
    assert len(text) <= 80 and time.monotonic() - started < 1


def _capped_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run_capped(args: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "RUNNER_STATE_DIR": str(tmp_path / "state")}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "runner", *args], capture_output=True, timeout=60, env=env,
                          cwd=REPO, preexec_fn=_capped_memory)
    return done, time.monotonic() - started


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_submit_dry_run_of_a_bomb_exits_2_in_bounded_memory(tmp_path, field):
    path = tmp_path / "bomb.yaml"
    path.write_text(FIELDS[field] % bomb())
    done, seconds = run_capped(["submit", str(path), "--dry-run"], tmp_path)
    assert done.returncode == 2, done.stderr.decode()[-500:]
    assert b"expands to more than" in done.stderr and seconds < 20


def test_submit_with_a_bomb_in_set_exits_2_in_bounded_memory(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(HEAD)
    done, seconds = run_capped(["submit", str(path), "--set", f"gpu.min_free_mib={bomb()}"], tmp_path)
    assert done.returncode == 2, done.stderr.decode()[-500:]
    assert b"expands to more than" in done.stderr and seconds < 20
