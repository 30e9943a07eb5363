"""The version is written once (runner/__init__.py); `runner --version` and the package's metadata read it."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import runner

REPO = Path(__file__).resolve().parents[2]


def test_runner_version_prints_the_one_version():
    done = subprocess.run([sys.executable, "-m", "runner", "--version"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip() == f"runner, version {runner.__version__}"


def test_the_package_metadata_takes_it_from_the_code():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert version("runner") == runner.__version__
