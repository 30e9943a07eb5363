"""The shipped job files: each validates and its payload args pass the script's own parser (what `submit` and
`submit --dry-run` check before any host is contacted); the motivating jobs compile before the stop."""
from __future__ import annotations

import pytest

from runner.commands import controller
from runner.spec.spec_load import load_spec
from tests.cli_helpers import REPO

JOBS = sorted((REPO / "jobs").glob("*.yaml"))


@pytest.mark.parametrize("path", JOBS, ids=[p.name for p in JOBS])
def test_job_file_passes_every_local_check(path):
    assert "checked against" in controller.local_plan(str(path), []).args_note


@pytest.mark.parametrize("name", ["k26_marlin.yaml", "k26_marlin_e128.yaml"])
def test_the_motivating_jobs_build_their_kernels_before_the_service_stops(name):
    """The JIT compile (minutes on a cold cache) runs as the prepare step, with the service still serving;
    the window holds only the timed run."""
    spec = load_spec(str(REPO / "jobs" / name), [])
    prepare = spec.prepare_argv()
    assert prepare is not None and "--prepare-only" in prepare, prepare
    assert "--prepare-only" not in spec.payload_args()
    assert [a for a in prepare if a != "--prepare-only"] == spec.payload_args()  # the same shape is built
