"""The MoE implementations the benchmark can time, and how each is found on the machine.

    sglang          the production entry point fused_marlin_moe (num_bits=4) from a full sglang install,
                    called with the keywords the installed version's signature has
    sglang-kernels  the kernel sequence fused_marlin_moe runs in sglang 0.5.17, imported without
                    sglang/__init__ (which pulls ~550 modules) by registering a bare `sglang` package
    torch           a reference: dequantize each routed expert, fp32 matmuls; runs on CPU too

Each backend is called as backend(x, topk_weights, topk_ids, buffers) -> output, where buffers come from
backend.buffers(m) (allocated once per batch size, outside any timed region).
"""
from __future__ import annotations

import importlib.util
import inspect
import sys
import types
from dataclasses import dataclass

import torch

from marlin_estimate import Shape, block_size_m, max_padded_tokens
from marlin_weights import MoeWeights, dequantize

ROUTED_SCALING_FACTOR = 2.827      # Kimi K2.x
SEQUENCE_0517 = ("sgl_kernel.moe_align_block_size (all M) -> moe_wna16_marlin_gemm (top_k, no topk weights) "
                 "-> sgl_kernel.silu_and_mul -> moe_wna16_marlin_gemm (top_k=1, topk weights) -> "
                 "sgl_kernel.moe_sum_reduce; caches preallocated per batch size and zeroed each call. "
                 "fused_marlin_moe 0.5.17 differs only at M=1 (a JIT single-token align) and in allocating "
                 "the caches per call")


class BackendUnavailable(Exception):
    """This backend cannot run here; the message says why (recorded when `auto` moves on)."""


# -- torch reference ------------------------------------------------------------------------------------

class TorchReference:
    """Dequantize each routed expert of GPTQ-layout weights and run the MoE in fp32."""
    name = "torch"
    weight_layout = "gptq"
    graph_safe = False                  # data-dependent expert loop: no CUDA-graph capture

    def __init__(self, shape: Shape, weights: MoeWeights, routed_scaling_factor: float = ROUTED_SCALING_FACTOR):
        self.shape, self.weights, self.rsf = shape, weights, routed_scaling_factor

    def buffers(self, m: int) -> dict:
        return {}

    def __call__(self, x: torch.Tensor, topk_w: torch.Tensor, topk_ids: torch.Tensor, buffers: dict) -> torch.Tensor:
        return self.forward_fp32(x, topk_w, topk_ids).to(x.dtype)

    def forward_fp32(self, x: torch.Tensor, topk_w: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        s, w = self.shape, self.weights
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in torch.unique(topk_ids).tolist():
            tokens, slots = torch.nonzero(topk_ids == e, as_tuple=True)
            w1 = dequantize(w.w1[e], w.s1[e], s.group_size)                 # [K, 2N]
            w2 = dequantize(w.w2[e], w.s2[e], s.group_size)                 # [N, K]
            h = x[tokens].to(torch.float32) @ w1
            act = torch.nn.functional.silu(h[:, : s.intermediate]) * h[:, s.intermediate:]
            out.index_add_(0, tokens, (act @ w2) * topk_w[tokens, slots].unsqueeze(1))
        return out * self.rsf


# -- sglang 0.5.17 inner kernel sequence ----------------------------------------------------------------

@dataclass
class KernelModules:
    sgl_kernel: object
    gemm: object
    uint4b8: object
    repack: object
    version: str


def sglang_package_dir() -> str:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise BackendUnavailable("no `sglang` package on sys.path")
    return list(spec.submodule_search_locations)[0]


def import_kernel_modules() -> KernelModules:
    """Register a bare `sglang` package (skipping its __init__) and import only the kernel modules."""
    package_dir = sglang_package_dir()
    if "sglang" not in sys.modules:
        bare = types.ModuleType("sglang")
        bare.__path__ = [package_dir]
        sys.modules["sglang"] = bare
    try:
        import sgl_kernel
        from sgl_kernel.scalar_type import scalar_types
        from sglang.kernels.ops.moe.moe_wna16_marlin import moe_wna16_marlin_gemm
        from sglang.kernels.ops.quantization.gptq_marlin_repack import gptq_marlin_repack
        from sglang.version import __version__ as version      # sglang/_version.py: no heavy imports
    except Exception as exc:  # any import failure means this backend is not available here
        raise BackendUnavailable(f"{type(exc).__name__}: {exc}") from exc
    check_gemm_signature(moe_wna16_marlin_gemm)
    return KernelModules(sgl_kernel, moe_wna16_marlin_gemm, scalar_types.uint4b8, gptq_marlin_repack, version)


GEMM_PARAMS_0517 = ("a", "c_or_none", "b_q_weight", "b_bias_or_none", "b_scales", "global_scale_or_none",
                    "b_zeros_or_none", "g_idx_or_none", "perm_or_none", "workspace", "sorted_token_ids",
                    "expert_ids", "num_tokens_post_padded", "topk_weights", "moe_block_size", "top_k",
                    "mul_topk_weights", "is_ep", "b_q_type", "size_m", "size_n", "size_k", "is_k_full",
                    "use_atomic_add", "use_fp32_reduce", "is_zp_float")


def check_gemm_signature(gemm) -> None:
    """The inner sequence is written for 0.5.17's GEMM; a changed signature means the sequence changed too."""
    params = tuple(inspect.signature(gemm).parameters)
    if params != GEMM_PARAMS_0517:
        raise BackendUnavailable(f"moe_wna16_marlin_gemm{params} is not 0.5.17's signature; "
                                 "use the `sglang` backend (fused_marlin_moe) with this version")


class SglangKernels:
    """fused_marlin_moe's 0.5.17 sequence with its caches preallocated per batch size."""
    name = "sglang-kernels"
    weight_layout = "marlin"
    graph_safe = True

    def __init__(self, shape: Shape, weights: MoeWeights, mods: KernelModules,
                 routed_scaling_factor: float = ROUTED_SCALING_FACTOR):
        self.shape, self.weights, self.mods, self.rsf = shape, weights, mods, routed_scaling_factor
        device = weights.w1.device
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.workspace = torch.zeros(sms * 4, dtype=torch.int32, device=device)
        # what fused_marlin_moe decides: atomic adds on fp16 or on sm90+
        self.atomic = weights.s1.dtype == torch.half or torch.cuda.get_device_capability(device)[0] >= 9

    def buffers(self, m: int) -> dict:
        s, device, dtype = self.shape, self.weights.w1.device, self.weights.s1.dtype
        bm = block_size_m(m, s)
        padded = max_padded_tokens(m, s)
        rows = m * s.topk
        c13 = torch.empty(rows * max(2 * s.intermediate, s.hidden), dtype=dtype, device=device)
        return {
            "block_m": bm,
            "sorted_ids": torch.empty(padded, dtype=torch.int32, device=device),
            "expert_ids": torch.empty(-(-padded // bm), dtype=torch.int32, device=device),
            "ntpp": torch.empty(1, dtype=torch.int32, device=device),
            "cumsum": torch.empty(s.experts + 2, dtype=torch.int32, device=device),
            "c13": c13,
            "c1": c13[: rows * 2 * s.intermediate].view(rows, 2 * s.intermediate),
            "c3": c13[: rows * s.hidden].view(rows, s.hidden),
            "c2": torch.empty(rows, s.intermediate, dtype=dtype, device=device),
            "out": torch.empty(m, s.hidden, dtype=dtype, device=device),
        }

    def _gemm(self, a, c, w, scales, b: dict, topk_w, top_k: int, mul_topk: bool, size_m: int, size_n: int,
              size_k: int) -> None:
        self.mods.gemm(a, c, w, None, scales, None, None, None, None, self.workspace, b["sorted_ids"],
                       b["expert_ids"], b["ntpp"], topk_w, moe_block_size=b["block_m"], top_k=top_k,
                       mul_topk_weights=mul_topk, is_ep=False, b_q_type=self.mods.uint4b8, size_m=size_m,
                       size_n=size_n, size_k=size_k, is_k_full=True, use_atomic_add=self.atomic,
                       use_fp32_reduce=True, is_zp_float=False)

    def __call__(self, x: torch.Tensor, topk_w: torch.Tensor, topk_ids: torch.Tensor, b: dict) -> torch.Tensor:
        s, w, sk = self.shape, self.weights, self.mods.sgl_kernel
        m = x.shape[0]
        sk.moe_align_block_size(topk_ids, s.experts + 1, b["block_m"], b["sorted_ids"], b["expert_ids"],
                                b["ntpp"], b["cumsum"], True)
        b["c13"].zero_()                # Marlin skips masked rows: the shared cache must start at zero
        self._gemm(x, b["c1"], w.w1, w.s1, b, topk_w, s.topk, False, m, 2 * s.intermediate, s.hidden)
        sk.silu_and_mul(b["c1"], b["c2"])
        self._gemm(b["c2"], b["c3"], w.w2, w.s2, b, topk_w, 1, True, m * s.topk, s.hidden, s.intermediate)
        sk.moe_sum_reduce(b["c3"].view(m, s.topk, s.hidden), b["out"], self.rsf)
        return b["out"]


# -- sglang production entry point ----------------------------------------------------------------------

class SglangFused:
    """fused_marlin_moe as sglang serves it, with the keywords the installed signature accepts."""
    name = "sglang"
    weight_layout = "marlin"
    graph_safe = True

    def __init__(self, shape: Shape, weights: MoeWeights, fused, version: str, m_max: int,
                 routed_scaling_factor: float = ROUTED_SCALING_FACTOR):
        self.shape, self.weights, self.fused = shape, weights, fused
        device = weights.w1.device
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.workspace = torch.zeros(sms * 4, dtype=torch.int32, device=device)
        self.gating = torch.zeros(m_max, shape.experts, dtype=weights.s1.dtype, device=device)
        self.kwargs = self.keywords(fused, routed_scaling_factor)
        self.version = version

    def keywords(self, fused, rsf: float) -> dict:
        wanted = {"num_bits": 4, "is_k_full": True, "inplace": False, "routed_scaling_factor": rsf,
                  "workspace": self.workspace}
        try:
            params = inspect.signature(fused).parameters
        except (TypeError, ValueError):
            return wanted
        if "num_bits" not in params:
            raise BackendUnavailable("fused_marlin_moe has no num_bits parameter: cannot ask for int4")
        return {k: v for k, v in wanted.items() if k in params}

    def buffers(self, m: int) -> dict:
        return {}

    def __call__(self, x: torch.Tensor, topk_w: torch.Tensor, topk_ids: torch.Tensor, buffers: dict) -> torch.Tensor:
        w = self.weights
        return self.fused(x, w.w1, w.w2, w.s1, w.s2, self.gating[: x.shape[0]], topk_w, topk_ids, **self.kwargs)


def import_fused():
    try:
        from sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe import fused_marlin_moe
        from sglang.version import __version__
    except Exception as exc:
        raise BackendUnavailable(f"{type(exc).__name__}: {exc}") from exc
    return fused_marlin_moe, __version__


def repack_function():
    """GPTQ → Marlin repack for one expert, wherever this sglang keeps it."""
    return import_kernel_modules().repack
