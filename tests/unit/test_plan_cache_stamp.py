"""The plan cache's code stamp covers the whole controller package, whichever sub-package a module lives in: a
plan is never older than any code that validated or decided it (runner/state/plan_cache.py)."""
from __future__ import annotations

from pathlib import Path

from runner.state import plan_cache

REPO = Path(__file__).resolve().parents[2]


def test_the_code_stamp_covers_every_module_of_the_controller():
    stamped = {entry[0] for entry in plan_cache._code_stamp()[1:]}
    modules = {str(path) for path in (REPO / "runner").rglob("*.py")}
    assert sorted(modules - stamped) == []
