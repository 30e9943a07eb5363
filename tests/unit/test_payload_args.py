"""payload.args are checked against the payload's own parser on the controller, before any host is contacted."""
from pathlib import Path

import pytest

from runner.errors import SpecError
from runner.spec.payload_args import check_args, is_checkable

ROOT = Path(__file__).resolve().parents[2] / "remote_payload" / "payloads"
DEMO, BENCH = ROOT / "demo" / "demo_payload.py", ROOT / "marlin_moe" / "bench_marlin_moe.py"


def argv(args: dict) -> list[str]:
    out = []
    for key, value in args.items():
        out += ["--" + key.replace("_", "-")] + ([] if value is True else [str(value)])
    return out


def test_a_typo_names_the_field_and_the_allowed_names():
    args = {"secnds": 5}
    with pytest.raises(SpecError) as caught:
        check_args(DEMO, args, argv(args), "jobs/demo.yaml")
    message = str(caught.value)
    assert message.startswith("jobs/demo.yaml: payload.args.secnds: demo_payload.py has no argument --secnds")
    assert "allowed: fail, out, seconds, sizes" in message


def test_a_value_of_the_wrong_type_names_its_key():
    args = {"seconds": "soon"}
    with pytest.raises(SpecError, match=r"payload\.args\.seconds: .*invalid float value: 'soon'"):
        check_args(DEMO, args, argv(args), "s.yaml")


def test_the_scripts_own_extra_checks_are_applied():
    args = {"sizes": "1,-4"}
    with pytest.raises(SpecError, match=r"payload\.args: demo_payload.py refuses it: --seconds and --sizes must be positive"):
        check_args(DEMO, args, argv(args), "s.yaml")


def test_the_benchmarks_args_are_checked_without_importing_torch():
    good = {"experts": 128, "batch_sizes": "1,8,64", "backend": "auto"}
    verdict = check_args(BENCH, good, argv(good), "k.yaml")
    assert verdict.checked and "--experts" in verdict.options
    bad = {"experts": 128, "batch_sizes": "1,1"}
    with pytest.raises(SpecError, match=r"payload\.args\.batch_sizes: .*distinct positive integers"):
        check_args(BENCH, bad, argv(bad), "k.yaml")
    with pytest.raises(SpecError, match=r"payload\.args\.bakend: bench_marlin_moe.py has no argument --bakend"):
        check_args(BENCH, {"bakend": "torch"}, ["--bakend", "torch"], "k.yaml")


def test_any_script_with_parse_args_is_checked_wherever_it_lives(tmp_path):
    """Not only remote_payload's: a user's script beside its YAML, importing its own helper."""
    (tmp_path / "helper.py").write_text("LIMIT = 3\n")
    script = tmp_path / "mine.py"
    script.write_text("import argparse\nfrom helper import LIMIT\n"
                      "def build_parser():\n    p = argparse.ArgumentParser()\n    p.add_argument('--n', type=int)\n"
                      "    return p\n"
                      "def parse_args(argv):\n    p = build_parser()\n    a = p.parse_args(argv)\n"
                      "    if a.n > LIMIT:\n        p.error('--n is at most %d' % LIMIT)\n    return a\n")
    assert check_args(script, {"n": 2}, ["--n", "2"], "s.yaml").checked
    with pytest.raises(SpecError, match=r"s.yaml: payload.args: mine.py refuses it: --n is at most 3"):
        check_args(script, {"n": 9}, ["--n", "9"], "s.yaml")
    with pytest.raises(SpecError, match=r"payload.args.m: mine.py has no argument --m; allowed: n"):
        check_args(script, {"m": 1}, ["--m", "1"], "s.yaml")


def test_a_script_without_parse_args_or_not_loadable_here_is_said_to_be_unchecked(tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text("import sys\nprint(sys.argv)\n")
    assert not is_checkable(plain)
    verdict = check_args(plain, {"anything": 1}, ["--anything", "1"], "s.yaml")
    assert not verdict.checked and "unchecked" in verdict.note
    heavy = tmp_path / "heavy.py"
    heavy.write_text("import no_such_gpu_stack\ndef parse_args(argv):\n    return argv\n")
    verdict = check_args(heavy, {}, [], "s.yaml")
    assert not verdict.checked and "cannot be loaded on the controller" in verdict.note
    assert "no_such_gpu_stack" in verdict.note


def test_a_parse_args_that_exits_is_a_refusal_not_a_crash(tmp_path):
    script = tmp_path / "exits.py"
    script.write_text("import sys\ndef parse_args(argv):\n    sys.exit(3)\n")
    with pytest.raises(SpecError, match=r"exits.py refuses it: parse_args exited \(3\)"):
        check_args(script, {}, [], "s.yaml")


def test_an_estimate_that_fails_is_reported_not_raised(tmp_path):
    script = tmp_path / "sized.py"
    script.write_text("def parse_args(argv):\n    return argv\ndef estimate_peak_bytes(args):\n    return 'lots'\n")
    verdict = check_args(script, {}, [], "s.yaml")
    assert verdict.checked and verdict.estimates == [None] and "not a whole number" in verdict.estimate_problem


@pytest.mark.parametrize("script, short", [(BENCH, {"batch_size": "1,8"}), (DEMO, {"second": 5})])
def test_a_prefix_of_a_packaged_payloads_option_is_no_option(script, short):
    """`batch_size` is not taken for `batch_sizes`: a near miss is a typo to be named, not a silent match."""
    key = next(iter(short))
    with pytest.raises(SpecError, match=rf"payload\.args\.{key}: {script.name} has no argument --{key.replace('_', '-')}"):
        check_args(script, short, argv(short), "s.yaml")
