"""payload.args are checked against the payload's own parser on the controller, before any host is contacted."""
from pathlib import Path

import pytest

from runner.errors import SpecError
from runner.payload_args import check_args, is_checkable

ROOT = Path(__file__).resolve().parents[1] / "remote_payload"
DEMO, BENCH = ROOT / "demo_payload.py", ROOT / "bench_marlin_moe.py"


def argv(args: dict) -> list[str]:
    out = []
    for key, value in args.items():
        out += ["--" + key.replace("_", "-")] + ([] if value is True else [str(value)])
    return out


def test_a_typo_names_the_field_and_the_allowed_names():
    args = {"secnds": 5}
    with pytest.raises(SpecError) as caught:
        check_args(DEMO, ROOT, args, argv(args), "jobs/demo.yaml")
    message = str(caught.value)
    assert message.startswith("jobs/demo.yaml: payload.args.secnds: demo_payload.py has no argument --secnds")
    assert "allowed: fail, out, seconds, sizes" in message


def test_a_value_of_the_wrong_type_names_its_key():
    args = {"seconds": "soon"}
    with pytest.raises(SpecError, match=r"payload\.args\.seconds: .*invalid float value: 'soon'"):
        check_args(DEMO, ROOT, args, argv(args), "s.yaml")


def test_the_scripts_own_extra_checks_are_applied():
    args = {"sizes": "1,-4"}
    with pytest.raises(SpecError, match=r"payload\.args: demo_payload.py refuses it: --seconds and --sizes must be positive"):
        check_args(DEMO, ROOT, args, argv(args), "s.yaml")


def test_the_benchmarks_args_are_checked_without_importing_torch():
    good = {"experts": 128, "batch_sizes": "1,8,64", "backend": "auto"}
    verdict = check_args(BENCH, ROOT, good, argv(good), "k.yaml")
    assert verdict.checked and "--experts" in verdict.options
    bad = {"experts": 128, "batch_sizes": "1,1"}
    with pytest.raises(SpecError, match=r"payload\.args\.batch_sizes: .*distinct positive integers"):
        check_args(BENCH, ROOT, bad, argv(bad), "k.yaml")
    with pytest.raises(SpecError, match=r"payload\.args\.bakend: bench_marlin_moe.py has no argument --bakend"):
        check_args(BENCH, ROOT, {"bakend": "torch"}, ["--bakend", "torch"], "k.yaml")


def test_a_script_outside_the_payload_dir_is_said_to_be_unchecked(tmp_path):
    script = tmp_path / "mine.py"
    script.write_text("import argparse\ndef parse_args(argv):\n    raise SystemExit('never run')\n")
    assert not is_checkable(script, ROOT)
    verdict = check_args(script, ROOT, {"anything": 1}, ["--anything", "1"], "s.yaml")
    assert not verdict.checked and "unchecked" in verdict.note
