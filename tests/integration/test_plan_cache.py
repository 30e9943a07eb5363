"""A warm submit reuses its validated plan (runner/state/plan_cache.py) and never a stale one: through the real CLI
on the local transport (the plan is decided before any host, so the transport does not matter here)."""
from __future__ import annotations

import os

from tests.cli_helpers import Target, run_cli, write_job
from tests.harness.plan_runs import output_of, submit_reporting
from tests.hosts._proc import shared_tmpdir


def local_target() -> Target:
    root = shared_tmpdir("runner-root-plan-")
    return Target("local", {"address": "local", "root": str(root)}, root, {})


def test_a_second_submit_of_the_same_spec_skips_validation_and_runs_alike(tmp_path):
    target = local_target()
    job = write_job(tmp_path / "job.yaml", target, command=["echo", "same plan"])
    first, validated_first = submit_reporting(job)
    second, validated_second = submit_reporting(job)
    assert validated_first and not validated_second
    assert first != second  # each submit still gets its own job id
    assert output_of(target, first) == output_of(target, second) == b"same plan\n"


def test_an_edited_spec_or_other_overrides_are_planned_afresh(tmp_path):
    target = local_target()
    job = write_job(tmp_path / "job.yaml", target, command=["sh", "-c", 'echo "$GREETING"'], env={"GREETING": "one"})
    submit_reporting(job)
    _, validated = submit_reporting(job, "--set", "payload.env.GREETING=two")
    assert validated
    overridden, _ = submit_reporting(job, "--set", "payload.env.GREETING=two")
    assert output_of(target, overridden) == b"two\n"
    write_job(job, target, command=["sh", "-c", 'echo "$GREETING"'], env={"GREETING": "three"})
    edited, validated = submit_reporting(job)
    assert validated and output_of(target, edited) == b"three\n"
    bad = job.read_text().replace("max_runtime:", "max_runtim:")
    job.write_text(bad)
    refused = run_cli(target, "submit", str(job))
    assert refused.returncode == 2 and b"max_runtim" in refused.stderr  # a cached plan never hides an error


def test_a_changed_payload_script_is_uploaded_and_run(tmp_path):
    """The plan records the bundle's digest: a script edited since is a miss, and its new bytes run."""
    target = local_target()
    script = tmp_path / "say.py"
    script.write_text("print('first version')\n")
    job = write_job(tmp_path / "job.yaml", target, script="say.py")
    first, _ = submit_reporting(job)
    assert output_of(target, first) == b"first version\n"
    script.write_text("print('second version')\n")
    second, validated = submit_reporting(job)
    assert validated and output_of(target, second) == b"second version\n"


def test_a_changed_helper_module_of_the_script_is_a_miss_too(tmp_path):
    """The plan records the payload bundle's digest, which covers the script's local imports: a helper edited
    since is planned afresh (its estimate and args check with it), and its new bytes run."""
    target = local_target()
    (tmp_path / "words.py").write_text("WORD = 'first'\n")
    (tmp_path / "say.py").write_text("from words import WORD\nprint(WORD)\n")
    job = write_job(tmp_path / "job.yaml", target, script="say.py")
    first, _ = submit_reporting(job)
    assert output_of(target, first) == b"first\n"
    again, validated = submit_reporting(job)
    assert not validated and output_of(target, again) == b"first\n"
    (tmp_path / "words.py").write_text("WORD = 'second'\n")
    second, validated = submit_reporting(job)
    assert validated and output_of(target, second) == b"second\n"


def test_an_unreadable_plan_is_a_miss_not_an_error(tmp_path, runner_state_dir):
    target = local_target()
    job = write_job(tmp_path / "job.yaml", target, command=["echo", "fine"])
    submit_reporting(job)
    for entry in (runner_state_dir / "plans").iterdir():
        entry.write_text("{not json")
    job_id, validated = submit_reporting(job)
    assert validated and output_of(target, job_id) == b"fine\n"
    assert not any(name.startswith(".tmp-") for name in os.listdir(runner_state_dir / "plans"))
