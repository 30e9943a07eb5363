"""The pure memory estimator: K2.6 sizes from the notes, the benchmark's estimate_peak_bytes that the controller
asks (in the args check's child), no torch import."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from remote_payload.payloads.marlin_moe.marlin_estimate import (Shape, block_size_m, estimate, estimate_from_args,
                                                                expert_bytes, weight_bytes, weight_tensor_bytes)
from runner.spec.payload_args import check_args

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "remote_payload" / "payloads" / "marlin_moe" / "bench_marlin_moe.py"
DEMO = ROOT / "remote_payload" / "payloads" / "demo" / "demo_payload.py"
K26 = Shape(experts=384, hidden=7168, intermediate=2048, topk=8, group_size=32)
K26_ARGS = {"experts": 384, "hidden": 7168, "intermediate": 2048, "topk": 8, "group_size": 32,
            "batch_sizes": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], "backend": "auto"}


def test_k26_weight_bytes_match_the_notes_table():
    assert weight_tensor_bytes(K26) == {"w1": 5_637_144_576, "w2": 2_818_572_288,
                                        "w1_scale": 704_643_072, "w2_scale": 352_321_536}
    assert weight_bytes(K26) == 9_512_681_472
    assert expert_bytes(K26) == pytest.approx(24.77e6, rel=1e-3)


def test_direct_weights_peak_stays_within_two_percent_of_the_weights():
    est = estimate(K26, K26_ARGS["batch_sizes"])
    assert est.weight_bytes < est.peak_allocated_bytes <= 1.02 * est.weight_bytes
    assert est.required_bytes > est.peak_allocated_bytes + est.context_bytes // 2


def test_repack_route_costs_about_one_expert_not_a_second_copy():
    direct = estimate(K26, [1], weights="direct")
    repack = estimate(K26, [1], weights="repack")
    extra = repack.peak_allocated_bytes - direct.peak_allocated_bytes
    assert 0 < extra < 3 * expert_bytes(K26)


def test_larger_batches_need_more_memory():
    small = estimate(K26, [1]).peak_allocated_bytes
    large = estimate(K26, [1, 512]).peak_allocated_bytes
    assert large > small


def test_block_size_follows_fused_marlin_moe():
    assert [block_size_m(m, K26) for m in (1, 256, 512, 1024, 4096)] == [8, 8, 16, 32, 64]


def argv(args: dict) -> list[str]:
    return [a for k, v in args.items() for a in ("--" + k.replace("_", "-"), ",".join(map(str, v))
                                                   if isinstance(v, list) else str(v))]


def test_the_bench_answers_its_estimate_and_the_demo_none():
    check = check_args(BENCH, K26_ARGS, argv(K26_ARGS), "k.yaml")
    assert check.estimates == [estimate_from_args(K26_ARGS).required_bytes]
    assert 9_000 < check.estimates[0] / 2**20 < 10_500
    assert check_args(DEMO, {}, [], "d.yaml").estimates == [None]


def test_args_in_comma_string_and_dashed_forms_give_the_same_estimate():
    dashed = {k.replace("_", "-"): v for k, v in K26_ARGS.items()}
    dashed["batch-sizes"] = ",".join(str(m) for m in K26_ARGS["batch_sizes"])
    assert estimate_from_args(dashed) == estimate_from_args(K26_ARGS)


def test_missing_shape_argument_is_named():
    with pytest.raises(KeyError, match="experts"):
        estimate_from_args({"hidden": 7168})


def test_importing_the_estimator_does_not_import_torch():
    code = ("import sys; import remote_payload.payloads.marlin_moe.marlin_estimate; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_estimate_is_within_five_percent_of_the_peak_measured_on_an_h200():
    measured = json.loads((ROOT / "results/h200/run2/cold.json").read_text())["memory"]
    est = estimate(K26, K26_ARGS["batch_sizes"], backend="sglang-kernels", order="ascending")
    assert est.peak_allocated_bytes == pytest.approx(measured["peak_allocated_bytes"], rel=0.05)
    assert est.required_bytes == pytest.approx(measured["device_used_peak_bytes"], rel=0.05)


def test_estimate_for_an_interleaved_order_holds_every_batch_size_and_matches_the_h200_peak():
    measured = json.loads((ROOT / "results/h200/run3/busy1.json").read_text())
    assert measured["args"]["order"] == "random"
    est = estimate(K26, K26_ARGS["batch_sizes"], backend="sglang-kernels", order="random")
    assert est.per_m_bytes > estimate(K26, K26_ARGS["batch_sizes"], order="ascending").per_m_bytes
    assert est.peak_allocated_bytes == pytest.approx(measured["memory"]["peak_allocated_bytes"], rel=0.05)
    assert est.peak_allocated_bytes <= 1.02 * est.weight_bytes
