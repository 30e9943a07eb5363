"""The `sglang` backend against a real torch custom op with sglang 0.5.17's fused_marlin_moe schema, and
`auto` falling back when a backend fails after its import (construction, first call).

sglang registers fused_marlin_moe with torch.library (`@register_custom_op`, eagerly), so the name it
exports is `torch.ops.sglang.fused_marlin_moe`, whose inspect.signature() is (*args, **kwargs). Here the same
registration is made in a test namespace with the same Python signature (0.5.17 fused_marlin_moe.py:134),
and a CPU kernel stands in for the CUDA one (this machine has no GPU): it records the keywords it got.
"""
import json
import sys
from pathlib import Path
from typing import Optional

import pytest

torch = pytest.importorskip("torch")

PAYLOAD = Path(__file__).resolve().parents[2] / "remote_payload" / "payloads" / "marlin_moe"
sys.path.insert(0, str(PAYLOAD))

import bench_marlin_moe as bench  # noqa: E402
import marlin_backends as mb  # noqa: E402
import marlin_weights as mw  # noqa: E402
from marlin_estimate import Shape  # noqa: E402

SCHEMA_0517 = (
    "(Tensor hidden_states, Tensor w1, Tensor w2, Tensor w1_scale, Tensor w2_scale, Tensor gating_output, "
    "Tensor topk_weights, Tensor topk_ids, SymInt global_num_experts=-1, Tensor? expert_map=None, "
    "Tensor? g_idx1=None, Tensor? g_idx2=None, Tensor? sort_indices1=None, Tensor? sort_indices2=None, "
    "Tensor? w1_zeros=None, Tensor? w2_zeros=None, Tensor? w1_global_scale=None, Tensor? w2_global_scale=None, "
    "Tensor? w1_bias=None, Tensor? w2_bias=None, Tensor? workspace=None, SymInt num_bits=8, bool is_k_full=True, "
    "bool inplace=False, float? routed_scaling_factor=None, float? clamp_limit=None, float? gemm1_alpha=None, "
    'str activation="silu", bool is_gated=True) -> Tensor')
CALLS: list[dict] = []


def fused_marlin_moe(
    hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w1_scale: torch.Tensor,
    w2_scale: torch.Tensor, gating_output: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
    global_num_experts: int = -1, expert_map: Optional[torch.Tensor] = None, g_idx1: Optional[torch.Tensor] = None,
    g_idx2: Optional[torch.Tensor] = None, sort_indices1: Optional[torch.Tensor] = None,
    sort_indices2: Optional[torch.Tensor] = None, w1_zeros: Optional[torch.Tensor] = None,
    w2_zeros: Optional[torch.Tensor] = None, w1_global_scale: Optional[torch.Tensor] = None,
    w2_global_scale: Optional[torch.Tensor] = None, w1_bias: Optional[torch.Tensor] = None,
    w2_bias: Optional[torch.Tensor] = None, workspace: Optional[torch.Tensor] = None, num_bits: int = 8,
    is_k_full: bool = True, inplace: bool = False, routed_scaling_factor: Optional[float] = None,
    clamp_limit: Optional[float] = None, gemm1_alpha: Optional[float] = None, activation: str = "silu",
    is_gated: bool = True,
) -> torch.Tensor:
    """CPU stand-in for the CUDA kernel: records what it was asked for, returns zeros of the right shape."""
    CALLS.append({"num_bits": num_bits, "is_k_full": is_k_full, "inplace": inplace,
                  "routed_scaling_factor": routed_scaling_factor, "workspace": workspace is not None})
    return torch.zeros_like(hidden_states)


def broken_first_call(hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w1_scale: torch.Tensor,
                      w2_scale: torch.Tensor, gating_output: torch.Tensor, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor, workspace: Optional[torch.Tensor] = None, num_bits: int = 8,
                      inplace: bool = False) -> torch.Tensor:
    raise RuntimeError("CUDA error: no kernel image is available for execution on the device")


def no_num_bits(hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w1_scale: torch.Tensor,
                w2_scale: torch.Tensor, gating_output: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    return torch.zeros_like(hidden_states)


LIB = torch.library.Library("runner_test_sglang", "FRAGMENT")       # kept alive: the ops live as long as it
for _fn in (fused_marlin_moe, broken_first_call, no_num_bits):
    LIB.define(_fn.__name__ + torch.library.infer_schema(_fn, mutates_args=[]))
    LIB.impl(_fn.__name__, _fn, "CPU")
OPS = torch.ops.runner_test_sglang
TINY = Shape(experts=8, hidden=128, intermediate=64, topk=2, group_size=32)
TINY_ARGS = ["--experts", "8", "--hidden", "128", "--intermediate", "64", "--topk", "2", "--batch-sizes", "1,2,4",
             "--device", "cpu", "--iterations", "3", "--repeats", "2"]


def test_the_op_is_registered_with_the_0517_schema_and_hides_its_parameters_from_inspect():
    import inspect
    assert str(OPS.fused_marlin_moe.default._schema) == "runner_test_sglang::fused_marlin_moe" + SCHEMA_0517
    assert list(inspect.signature(OPS.fused_marlin_moe).parameters) == ["args", "kwargs"]


def test_keywords_come_from_the_ops_schema():
    workspace = torch.zeros(4, dtype=torch.int32)
    wanted = {"num_bits": 4, "is_k_full": True, "inplace": False, "routed_scaling_factor": 2.827,
              "workspace": workspace}
    assert mb.fused_keywords(OPS.fused_marlin_moe, wanted) == wanted
    assert mb.parameter_names(OPS.fused_marlin_moe)[-8:-4] == ["num_bits", "is_k_full", "inplace",
                                                               "routed_scaling_factor"]


def test_keywords_still_read_a_plain_python_function_and_drop_what_it_lacks():
    wanted = {"num_bits": 4, "is_k_full": True, "inplace": False, "routed_scaling_factor": 2.827, "workspace": None}
    got = mb.fused_keywords(broken_first_call, wanted)
    assert got == {"num_bits": 4, "inplace": False, "workspace": None}


def test_an_op_without_num_bits_is_refused_rather_than_run_at_8_bits():
    with pytest.raises(mb.BackendUnavailable, match="num_bits"):
        mb.fused_keywords(OPS.no_num_bits, {"num_bits": 4})


def test_the_sglang_backend_calls_the_registered_op_with_int4_keywords():
    weights = mw.direct_weights(TINY, "marlin", torch.bfloat16, "cpu", seed=0)
    backend = mb.SglangFused(TINY, weights, OPS.fused_marlin_moe, "0.5.17", m_max=4)
    CALLS.clear()
    out = backend(torch.randn(3, TINY.hidden).to(torch.bfloat16), torch.rand(3, 2),
                  torch.zeros(3, 2, dtype=torch.int32), {})
    assert out.shape == (3, TINY.hidden)
    assert CALLS == [{"num_bits": 4, "is_k_full": True, "inplace": False, "routed_scaling_factor": 2.827,
                      "workspace": True}]


def run_auto_with_sglang_as(op, monkeypatch, tmp_path, *extra) -> tuple[int, dict]:
    """A CPU run where the `sglang` backend imports (as on a host with full sglang) and yields `op`."""
    real = bench.load_backend

    def load(name, device, mods, probe):
        return (op, "0.5.17") if name == "sglang" else real(name, device, mods, probe)

    monkeypatch.setattr(bench, "load_backend", load)
    checks = bench.shape_problems              # `--backend sglang` is refused on the CPU before any import
    monkeypatch.setattr(bench, "shape_problems", lambda a: [p for p in checks(a) if "needs --device cuda" not in p])
    out = tmp_path / "result.json"
    code = bench.main([*TINY_ARGS, *extra, "--out", str(out)])
    return code, json.loads(out.read_text())


def test_auto_falls_back_when_the_first_call_fails_and_says_why(monkeypatch, tmp_path, capsys):
    code, result = run_auto_with_sglang_as(OPS.broken_first_call, monkeypatch, tmp_path, "--backend", "auto")
    assert code == 0
    first = result["backend"]["attempts"][0]
    assert first["backend"] == "sglang" and not first["ok"] and first["stage"] == "first_call"
    assert "no kernel image" in first["reason"]
    assert result["backend"]["used"] == "torch"
    assert "sglang failed at first_call" in result["backend"]["why"]
    assert [r["m"] for r in result["rows"]] == [1, 2, 4]


def test_auto_falls_back_when_construction_fails(monkeypatch, tmp_path, capsys):
    code, result = run_auto_with_sglang_as(OPS.no_num_bits, monkeypatch, tmp_path, "--backend", "auto")
    assert code == 0
    first = result["backend"]["attempts"][0]
    assert first["stage"] == "construct" and "num_bits" in first["reason"]
    assert result["backend"]["used"] == "torch"


def test_a_requested_backend_that_fails_its_first_call_fails_the_run(monkeypatch, tmp_path, capsys):
    code, result = run_auto_with_sglang_as(OPS.broken_first_call, monkeypatch, tmp_path, "--backend", "sglang")
    assert code == 1
    assert "sglang (first_call)" in result["error"] and "rows" not in result
    assert result["backend"]["used"] is None


def test_auto_uses_the_working_op_on_the_cpu(monkeypatch, tmp_path, capsys):
    code, result = run_auto_with_sglang_as(OPS.fused_marlin_moe, monkeypatch, tmp_path, "--backend", "auto")
    assert code == 0
    assert result["backend"]["used"] == "sglang"
    assert result["backend"]["keywords"] == ["inplace", "is_k_full", "num_bits", "routed_scaling_factor",
                                             "workspace"]
    assert result["environment"]["sglang"] == "0.5.17"


def test_the_kernel_sequence_says_where_it_still_differs_from_fused_marlin_moe():
    mods = mb.KernelModules(None, None, None, None, "0.5.17")
    mods.missing["activation"] = "sglang.kernels.ops.activation.activation.silu_and_mul unavailable (…)"
    seq = mods.sequence()
    assert seq["align_m1"] == "sgl_kernel.moe_align_block_size" and seq["activation"] == "sgl_kernel.silu_and_mul"
    assert any("preallocated" in d for d in seq["differs_from_fused_marlin_moe"])
    assert any(d.startswith("activation:") for d in seq["differs_from_fused_marlin_moe"])
    mods.align_single_token, mods.activation, mods.missing = len, len, {}
    assert mods.sequence()["align_m1"] == "sglang moe_align_single_token"
    assert len(mods.sequence()["differs_from_fused_marlin_moe"]) == 1
