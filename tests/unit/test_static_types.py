"""mypy over runner/ and remote_payload/ (pyproject.toml's [tool.mypy]) finds no error: the annotations are
checked, not only read. The modules listed there under `ignore_errors` are the known exceptions, to be cleared."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed (the `test` extra brings it: pip install -e '.[test]')")
def test_mypy_finds_no_error():
    checked = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert checked.returncode == 0, checked.stdout + checked.stderr
