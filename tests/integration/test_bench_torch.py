"""The torch reference backend and weight layouts on CPU at tiny shapes, and a whole CPU run's result.json.

Needs torch (CI installs torch==2.13.0, a CPU wheel); skipped where torch is absent.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.pace import Scale

torch = pytest.importorskip("torch")

PAYLOAD = Path(__file__).resolve().parents[2] / "remote_payload" / "payloads" / "marlin_moe"
sys.path.insert(0, str(PAYLOAD))          # the payload's modules import each other as top-level modules

import marlin_backends as mb  # noqa: E402
import marlin_weights as mw  # noqa: E402
from marlin_estimate import Shape  # noqa: E402

TINY = Shape(experts=6, hidden=128, intermediate=64, topk=2, group_size=32)


def test_pack_then_unpack_gives_back_every_nibble():
    q = torch.randint(0, 16, (3, 64, 5), generator=torch.Generator().manual_seed(1))
    packed = mw.pack_int4(q)
    assert packed.dtype == torch.int32 and packed.shape == (3, 8, 5)
    assert torch.equal(mw.unpack_int4(packed), q)


def test_nibble_order_is_low_bits_first():
    q = torch.zeros(1, 8, 1, dtype=torch.int64)
    q[0, 1, 0] = 0xF
    assert mw.pack_int4(q).item() == 0xF0


def dense_experts(shape: Shape, seed: int):
    """Known int4 values and scales, and the dense fp32 matrices they stand for (built without unpacking)."""
    g = torch.Generator().manual_seed(seed)
    e, k, n, gs = shape.experts, shape.hidden, shape.intermediate, shape.group_size
    q1, q2 = torch.randint(0, 16, (e, k, 2 * n), generator=g), torch.randint(0, 16, (e, n, k), generator=g)
    s1 = torch.rand(e, k // gs, 2 * n, generator=g) * 0.02 + 0.002
    s2 = torch.rand(e, n // gs, k, generator=g) * 0.02 + 0.002
    dense1 = (q1.double() - 8) * s1.double().repeat_interleave(gs, dim=1)
    dense2 = (q2.double() - 8) * s2.double().repeat_interleave(gs, dim=1)
    weights = mw.MoeWeights("gptq", mw.pack_int4(q1), mw.pack_int4(q2), s1, s2)
    return weights, dense1, dense2


def direct_moe(x, topk_w, topk_ids, dense1, dense2, n, rsf):
    """Token by token: the routed experts' silu(gate) * up, down-projected, weighted, summed, scaled."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for slot in range(topk_ids.shape[1]):
            e = int(topk_ids[t, slot])
            h = x[t].double() @ dense1[e]
            act = torch.nn.functional.silu(h[:n]) * h[n:]
            out[t] += float(topk_w[t, slot]) * (act @ dense2[e])
    return out * rsf


@pytest.mark.parametrize("m", [1, 3, 7])
def test_torch_backend_matches_a_direct_dequantized_computation(m):
    weights, dense1, dense2 = dense_experts(TINY, seed=m)
    g = torch.Generator().manual_seed(100 + m)
    x = torch.randn(m, TINY.hidden, generator=g)
    topk_ids = torch.stack([torch.randperm(TINY.experts, generator=g)[:TINY.topk] for _ in range(m)]).to(torch.int32)
    topk_w = torch.rand(m, TINY.topk, generator=g)
    backend = mb.TorchReference(TINY, weights)
    got = backend.forward_fp32(x, topk_w, topk_ids).double()
    want = direct_moe(x, topk_w, topk_ids, dense1, dense2, TINY.intermediate, mb.ROUTED_SCALING_FACTOR)
    assert ((got - want).norm() / want.norm()).item() < 1e-5


def test_torch_backend_output_depends_on_routing():
    weights, _, _ = dense_experts(TINY, seed=0)
    backend = mb.TorchReference(TINY, weights)
    x = torch.randn(2, TINY.hidden)
    w = torch.full((2, 2), 0.5)
    a = backend.forward_fp32(x, w, torch.tensor([[0, 1], [2, 3]], dtype=torch.int32))
    b = backend.forward_fp32(x, w, torch.tensor([[0, 1], [4, 5]], dtype=torch.int32))
    assert torch.equal(a[0], b[0]) and not torch.allclose(a[1], b[1])


def test_marlin_scale_permutation_is_a_permutation_and_the_corrupt_one_differs():
    perm = mw.marlin_scale_perm()
    assert sorted(perm) == list(range(64)) and perm != list(range(64))
    assert sorted(mw.marlin_channelwise_scale_perm()) == list(range(32))
    s = torch.arange(4 * 128, dtype=torch.float32).reshape(4, 128)
    good, bad = mw.permute_scales(s, 128, 32), mw.permute_scales(s, 128, 32, corrupt=True)
    assert torch.equal(good.sort(dim=1).values, s) and not torch.equal(good, bad)
    assert good[0, 1].item() == 8.0              # slot 1 of a chunk holds column 8


def test_direct_weights_have_the_layout_shapes_and_dtypes():
    w = mw.direct_weights(TINY, "marlin", torch.bfloat16, "cpu", seed=0)
    assert w.w1.shape == (6, 128 // 16, 4 * 64) and w.w2.shape == (6, 64 // 16, 2 * 128)
    assert w.s1.dtype == torch.bfloat16 and bool((w.s1 > 0).all())
    assert w.nbytes() == sum(t.numel() * t.element_size() for t in (w.w1, w.w2, w.s1, w.s2))


def run_bench(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, str(PAYLOAD / "bench_marlin_moe.py"), "--experts", "8", "--hidden", "128",
         "--intermediate", "64", "--topk", "2", "--batch-sizes", "1,2,4", "--device", "cpu",
         "--iterations", "4", "--repeats", "3", "--out", str(out), *extra],
        capture_output=True, text=True, cwd=tmp_path, timeout=Scale()(120))
    return done, json.loads(out.read_text())


def test_cpu_run_writes_the_result_schema(tmp_path):
    done, result = run_bench(tmp_path, "--backend", "auto")
    assert done.returncode == 0, done.stderr
    assert result["schema"] == 1 and result["args"]["batch_sizes"] == [1, 2, 4]
    assert result["backend"]["used"] == "torch"
    assert [a["backend"] for a in result["backend"]["attempts"]] == ["sglang", "sglang-kernels", "torch"]
    assert "needs a CUDA device" in result["backend"]["why"]
    assert result["timing"]["used"] == "eager" and "CUDA graphs" in result["timing"]["why"]
    assert result["jit"]["state"] == "warm"
    assert result["memory"]["weight_bytes"] > 0 and result["memory"]["estimate"]["weight_bytes"] > 0
    assert [r["m"] for r in result["rows"]] == [1, 2, 4]
    for row in result["rows"]:
        assert len(row["rep_median_us"]) == 3 and row["samples"] == 12
        assert row["p10_us"] <= row["median_us"] <= row["p90_us"]
        assert row["us_per_token"] == pytest.approx(row["median_us"] / row["m"])
        assert 1 <= row["distinct_experts"] <= min(8, 2 * row["m"])
    assert result["rows"][0]["lever"] == pytest.approx(1.0)
    assert set(result["lever"]["by_m"]) == {"1", "2", "4"}
    assert set(result["phases"]) >= {"import", "weights", "jit", "batch"}
    assert 0 < result["first_row_s"] <= result["total_s"]


def test_cpu_run_prints_one_json_event_per_line_with_heartbeats_in_a_slow_phase(tmp_path):
    done, _ = run_bench(tmp_path, "--backend", "torch", "--timing", "eager", "--heartbeat-s", "0.2",
                        "--test-slow-phase", "jit:1.2")
    events = [json.loads(line) for line in done.stdout.splitlines()]
    jit = [i for i, e in enumerate(events) if e.get("phase") == "jit" and e["event"] == "phase"]
    assert len(jit) == 2
    beats = [e for e in events[jit[0]:jit[1]] if e["event"] == "heartbeat"]
    assert len(beats) >= 4 and all(e["phase"] == "jit" for e in beats)
    assert [e["m"] for e in events if e["event"] == "row"] == [1, 2, 4]
    assert events[-1]["event"] == "done" and events[-1]["exit_code"] == 0


def test_zipf_routing_concentrates_on_fewer_experts(tmp_path):
    _, uniform = run_bench(tmp_path, "--backend", "torch", "--routing", "uniform")
    _, zipf = run_bench(tmp_path, "--backend", "torch", "--routing", "zipf", "--zipf-skew", "2.0")
    assert zipf["rows"][-1]["distinct_experts"] < uniform["rows"][-1]["distinct_experts"]


def test_windows_follow_the_recorded_order_and_every_row_keeps_its_windows(tmp_path):
    done, result = run_bench(tmp_path, "--backend", "torch", "--order", "random", "--order-seed", "11",
                             "--settle", "idle", "--settle-ms", "1")
    assert done.returncode == 0, done.stderr
    order = result["timing"]["order"]
    assert order["mode"] == "random" and order["seed"] == 11 and sorted(order["windows"]) == [1, 1, 1, 2, 2, 2, 4, 4, 4]
    assert result["timing"]["settle"] == {"mode": "idle", "ms": 1.0}
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["m"] for e in events if e["event"] == "window"] == order["windows"]
    for row in result["rows"]:
        assert [w["rep"] for w in row["windows"]] == [0, 1, 2]
        assert [w["median_us"] for w in row["windows"]] == row["rep_median_us"]
        assert [order["windows"][w["index"]] for w in row["windows"]] == [row["m"]] * 3
        assert row["lever_ci95"][0] <= row["lever_ci95"][1]
    assert result["timing"]["capped_windows"] is None            # no NVML on the CPU


def test_ascending_order_reproduces_the_old_sequence(tmp_path):
    done, result = run_bench(tmp_path, "--backend", "torch", "--order", "ascending")
    assert done.returncode == 0, done.stderr
    assert result["timing"]["order"]["windows"] == [1, 1, 1, 2, 2, 2, 4, 4, 4]


def test_prepare_only_imports_and_builds_without_weights_or_timing(tmp_path):
    done, result = run_bench(tmp_path, "--prepare-only", "--backend", "auto")
    assert done.returncode == 0, done.stderr
    prepare = result["prepare"]
    assert prepare["backend"] == "torch" and prepare["kernels"] == []        # nothing to compile on the CPU
    assert [a["backend"] for a in prepare["attempts"]] == ["sglang", "sglang-kernels"]
    assert "weights" not in result["phases"] and "rows" not in result and result["jit"]["state"] == "warm"


def test_own_gpu_memory_is_read_from_nvidia_smi_compute_apps():
    import marlin_env
    text = "4242, 512\n77, 80000\n"
    assert marlin_env.parse_compute_apps(text, 4242) == 512 and marlin_env.parse_compute_apps(text, 5) is None


def test_cool_settle_waits_for_the_first_windows_temperature_and_is_bounded():
    """--settle cool: idle until within cool_c of the first window's start temperature, never past cool_max_ms."""
    import argparse
    import bench_marlin_moe as bench
    temps = iter([60, 58, 56, 55, 54])
    runner = bench.Bench.__new__(bench.Bench)
    runner.args = argparse.Namespace(cool_c=3.0, cool_max_ms=5000.0)
    runner.gpu_state = lambda: {"temp_c": next(temps)}
    timed = {512: [{"index": 0, "start": {"temp_c": 52}}], 1: []}
    cooled = runner.cool_down(timed)
    assert cooled["temp_c"] == 55 and cooled["target_c"] == 55 and cooled["waited_ms"] < 5000
    runner.args.cool_max_ms = 100.0
    runner.gpu_state = lambda: {"temp_c": 90}
    cooled = runner.cool_down(timed)
    assert cooled["temp_c"] == 90 and 100 <= cooled["waited_ms"] < 2000
    assert runner.cool_down({1: []}) is None  # nothing timed yet: no reference temperature


def test_cool_settle_runs_without_nvml_and_is_recorded(tmp_path):
    done, result = run_bench(tmp_path, "--backend", "torch", "--order", "interleave", "--settle", "cool",
                             "--settle-ms", "1", "--cool-max-ms", "10")
    assert done.returncode == 0, done.stderr
    assert result["timing"]["order"]["mode"] == "interleave"
    assert result["timing"]["settle"] == {"mode": "cool", "ms": 1.0, "cool_c": 3.0, "cool_max_ms": 10.0}
