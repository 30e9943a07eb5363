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

import importlib
import importlib.util
import inspect
import sys
import time
import types
from dataclasses import dataclass, field
from typing import Callable

import torch
from marlin_estimate import Shape, block_size_m, max_padded_tokens
from marlin_weights import MoeWeights, dequantize

ROUTED_SCALING_FACTOR = 2.827      # Kimi K2.x
SEQUENCE_0517 = ("align (sgl_kernel.moe_align_block_size; at M=1 with int32 ids sglang's JIT moe_align_single_token "
                 "where importable) -> moe_wna16_marlin_gemm (top_k, no topk weights) -> silu_and_mul (sglang's "
                 "JIT activation where importable, else sgl_kernel's) -> moe_wna16_marlin_gemm (top_k=1, topk "
                 "weights) -> sgl_kernel.moe_sum_reduce; caches preallocated per batch size and zeroed each call")
# What stays different from fused_marlin_moe 0.5.17 even when every sglang kernel it uses is importable.
ALWAYS_DIFFERS = ("caches (sorted ids, intermediate caches, output) preallocated per batch size instead of "
                  "allocated on every call; no custom-op dispatch",)


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
    sgl_kernel: types.ModuleType
    gemm: Callable
    uint4b8: object
    repack: object
    version: str
    align_single_token: Callable | None = None     # sglang's JIT align for one token (what M=1 uses)
    activation: Callable | None = None             # sglang's JIT silu_and_mul (what fused_marlin_moe uses)
    missing: dict = field(default_factory=dict)    # kernel -> why the installed sglang could not give it

    def sequence(self) -> dict:
        """Which kernels this run uses and where it still differs from fused_marlin_moe (for result.json)."""
        differs = list(ALWAYS_DIFFERS)
        differs += [f"{kernel}: {why}" for kernel, why in self.missing.items()]
        return {"align_m1": "sglang moe_align_single_token" if self.align_single_token
                else "sgl_kernel.moe_align_block_size",
                "activation": "sglang silu_and_mul (JIT)" if self.activation else "sgl_kernel.silu_and_mul",
                "differs_from_fused_marlin_moe": differs}


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
        from sglang.version import __version__ as version  # sglang/_version.py: no heavy imports
    except Exception as exc:  # any import failure means this backend is not available here
        raise BackendUnavailable(f"{type(exc).__name__}: {exc}") from exc
    check_gemm_signature(moe_wna16_marlin_gemm)
    mods = KernelModules(sgl_kernel, moe_wna16_marlin_gemm, scalar_types.uint4b8, gptq_marlin_repack, version)
    mods.align_single_token = optional_kernel(mods, "single-token align",
                                              "sglang.kernels.ops.moe.moe_align_single_token", "moe_align_single_token")
    mods.activation = optional_kernel(mods, "activation", "sglang.kernels.ops.activation.activation", "silu_and_mul")
    return mods


def optional_kernel(mods: KernelModules, kernel: str, module: str, name: str) -> Callable | None:
    """A kernel fused_marlin_moe uses that this sglang may not offer without its full install (the JIT
    activation module imports sglang.srt.utils); on failure the sequence uses sgl_kernel's and says why."""
    try:
        return getattr(importlib.import_module(module), name)
    except Exception as exc:  # any failure: fall back to the sgl_kernel op, recorded in mods.missing
        mods.missing[kernel] = f"{module}.{name} unavailable ({type(exc).__name__}: {exc}); used sgl_kernel's"
        return None


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
        self.workspace = marlin_workspace(device)
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
        if m == 1 and self.mods.align_single_token and topk_ids.dtype == torch.int32:
            # fused_marlin_moe's M=1 path: one single-warp kernel (it allocates its three small outputs)
            b = {**b, **dict(zip(("sorted_ids", "expert_ids", "ntpp"),
                                 self.mods.align_single_token(topk_ids, b["block_m"])))}
        else:
            sk.moe_align_block_size(topk_ids, s.experts + 1, b["block_m"], b["sorted_ids"], b["expert_ids"],
                                    b["ntpp"], b["cumsum"], True)
        b["c13"].zero_()                # Marlin skips masked rows: the shared cache must start at zero
        self._gemm(x, b["c1"], w.w1, w.s1, b, topk_w, s.topk, False, m, 2 * s.intermediate, s.hidden)
        (self.mods.activation or sk.silu_and_mul)(b["c1"], b["c2"])
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
        self.workspace = marlin_workspace(device)
        self.gating = torch.zeros(m_max, shape.experts, dtype=weights.s1.dtype, device=device)
        self.kwargs = fused_keywords(fused, {"num_bits": 4, "is_k_full": True, "inplace": False,
                                             "routed_scaling_factor": routed_scaling_factor,
                                             "workspace": self.workspace})
        self.version = version

    def buffers(self, m: int) -> dict:
        return {}

    def __call__(self, x: torch.Tensor, topk_w: torch.Tensor, topk_ids: torch.Tensor, buffers: dict) -> torch.Tensor:
        w = self.weights
        return self.fused(x, w.w1, w.w2, w.s1, w.s2, self.gating[: x.shape[0]], topk_w, topk_ids, **self.kwargs)


def parameter_names(fn) -> list[str] | None:
    """Parameter names of a registered torch op (from its schema: `inspect.signature` of an op only says
    (*args, **kwargs)) or of a Python function; None when neither tells."""
    overload = getattr(fn, "default", None) if isinstance(fn, torch._ops.OpOverloadPacket) else fn
    schema = getattr(overload, "_schema", None)
    if schema is not None:
        return [arg.name for arg in schema.arguments]
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params]


def fused_keywords(fused, wanted: dict) -> dict:
    """The keywords of `wanted` that this fused_marlin_moe accepts; int4 (num_bits) is not optional."""
    names = parameter_names(fused)
    if names is None:
        return dict(wanted)
    if "num_bits" not in names:
        raise BackendUnavailable("fused_marlin_moe has no num_bits parameter: cannot ask for int4")
    return {k: v for k, v in wanted.items() if k in names}


def marlin_workspace(device: torch.device) -> torch.Tensor:
    """The zeroed int32 locks both GEMMs share: 4 per SM (a token 4 elsewhere, where no kernel runs)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    return torch.zeros(sms * 4, dtype=torch.int32, device=device)


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


# -- building the JIT kernels ahead of the run (--prepare-only) --------------------------------------------

# The module builders of sglang 0.5.17 that fused_marlin_moe and the kernel sequence load: (kernel, module,
# builder, how to call it with the activation dtype). Each builds for the arch sglang detects on this device.
JIT_BUILDERS_0517 = (
    ("moe_wna16_marlin", "sglang.kernels.ops.moe.moe_wna16_marlin", "_jit_moe_wna16_marlin_module",
     lambda build, dtype: build(dtype, False, False)),
    ("moe_align_single_token", "sglang.kernels.ops.moe.moe_align_single_token", "_jit_align_single_token_module",
     lambda build, dtype: build()),
    ("activation", "sglang.kernels.ops.activation.activation", "activation_module",
     lambda build, dtype: build(dtype)),
    ("gptq_marlin_repack", "sglang.kernels.ops.quantization.gptq_marlin_repack", "_jit_gptq_marlin_repack_module",
     lambda build, dtype: build()),
)


def build_jit_kernels(dtype: torch.dtype) -> list[dict]:
    """Build (or load from the cache) every JIT module the Marlin backends use; no tensor is allocated."""
    built = []
    for kernel, module, builder, call in JIT_BUILDERS_0517:
        began = time.monotonic()
        try:
            call(getattr(importlib.import_module(module), builder), dtype)
        except Exception as exc:  # one module failing (e.g. the activation without sglang.srt) is recorded
            built.append({"kernel": kernel, "ok": False, "seconds": time.monotonic() - began,
                          "reason": f"{type(exc).__name__}: {exc}"})
            continue
        built.append({"kernel": kernel, "ok": True, "seconds": time.monotonic() - began})
    return built


def jit_arch() -> dict:
    """The target sglang's JIT derives from this device (e.g. 9.0a on an H200, 10.0a on a B200)."""
    try:
        from sglang.kernels.jit.utils.arch import get_jit_cuda_arch
        arch = get_jit_cuda_arch()
    except Exception as exc:  # an sglang without this helper: say so rather than guess
        return {"target": None, "reason": f"{type(exc).__name__}: {exc}"}
    return {"target": arch.target_name, "major": arch.major, "minor": arch.minor}
