"""Pure-Python sizes and peak GPU memory of the Marlin MoE benchmark (no torch: the controller imports it).

The numbers follow the tensors bench_marlin_moe.py allocates, in the order it allocates them:

    copy-bandwidth probe   two buffers, freed (and the cache emptied) before anything else
    weights                w1, w2 (int32, Marlin or GPTQ layout: same bytes) and their scales
    repack scratch         --weights repack only: one expert's GPTQ source and repack output at a time
    workspace              sms * 4 int32 locks shared by both GEMMs
    static inputs          x, topk_ids, topk_weights (and gating for fused_marlin_moe) at the largest M
    per-M buffers          align outputs + the GEMM caches + the output: one batch size at a time with
                           --order ascending; every batch size at once with an interleaved order (random,
                           alternating), which keeps each batch size's buffers and graph until its last window

so the peak of allocated bytes is weights + the larger of (repack scratch) and
(workspace + static inputs + per-M buffers). `required_bytes` adds the caching
allocator's slack and the memory CUDA and the kernel modules take outside the allocator: that is what
must be free on the GPU before the payload starts.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

MIB = 1 << 20
ALLOC_ROUND = 512                  # the caching allocator rounds every block up to 512 B
H200_SMS = 132                     # workspace is sms*4 int32; 132 SMs is the largest part we target
# Device memory outside torch's allocator: CUDA context, torch's and the Marlin module's kernels.
# Measured on an H200 (torch 2.11, sglang 0.5.17): 689–691 MiB, of which the bare context is 527 MiB.
CONTEXT_BYTES = 704 * MIB
ALLOCATOR_SLACK_BYTES = 64 * MIB   # reserved above allocated: 21–35 MiB measured
COPY_PROBE_BYTES = 2 * 256 * MIB   # source + destination of the copy-bandwidth probe
DTYPE_BYTES = {"bf16": 2, "fp16": 2}
BLOCK_SIZES_M = (8, 16, 32, 48, 64)


@dataclass(frozen=True)
class Shape:
    experts: int
    hidden: int          # K
    intermediate: int    # N
    topk: int
    group_size: int
    dtype_bytes: int = 2


def round_block(nbytes: int) -> int:
    return -(-nbytes // ALLOC_ROUND) * ALLOC_ROUND


def weight_tensor_bytes(s: Shape) -> dict[str, int]:
    """Bytes of the four weight tensors (int4 packed 8 per int32; Marlin and GPTQ layouts are the same size)."""
    e, k, n, g = s.experts, s.hidden, s.intermediate, s.group_size
    return {
        "w1": e * (k // 16) * (2 * 2 * n) * 4,
        "w2": e * (n // 16) * (2 * k) * 4,
        "w1_scale": e * (k // g) * (2 * n) * s.dtype_bytes,
        "w2_scale": e * (n // g) * k * s.dtype_bytes,
    }


def weight_bytes(s: Shape) -> int:
    return sum(weight_tensor_bytes(s).values())


def expert_bytes(s: Shape) -> float:
    """Bytes one expert's weights and scales occupy: what a token routed to it makes the GEMMs read."""
    return weight_bytes(s) / s.experts


def block_size_m(m: int, s: Shape) -> int:
    """fused_marlin_moe's choice: the first block size that leaves most blocks under-filled, else 64."""
    for bm in BLOCK_SIZES_M:
        if m * s.topk / s.experts / bm < 0.9:
            return bm
    return BLOCK_SIZES_M[-1]


def max_padded_tokens(m: int, s: Shape) -> int:
    numel = m * s.topk
    bm = block_size_m(m, s)
    return numel * bm if numel < s.experts + 1 else numel + (s.experts + 1) * (bm - 1)


def per_m_buffers(m: int, s: Shape) -> dict[str, int]:
    """The tensors one MoE call at batch size m allocates (align outputs, GEMM caches, output)."""
    bm = block_size_m(m, s)
    padded = max_padded_tokens(m, s)
    rows = m * s.topk
    return {
        "sorted_token_ids": round_block(padded * 4),
        "expert_ids": round_block(-(-padded // bm) * 4),
        "num_tokens_post_padded": round_block(4),
        "cumsum": round_block((s.experts + 2) * 4),
        "cache13": round_block(rows * max(2 * s.intermediate, s.hidden) * s.dtype_bytes),
        "cache2": round_block(rows * s.intermediate * s.dtype_bytes),
        "output": round_block(m * s.hidden * s.dtype_bytes),
    }


def static_inputs(m_max: int, s: Shape, gating: bool) -> dict[str, int]:
    out = {
        "x": round_block(m_max * s.hidden * s.dtype_bytes),
        "topk_ids": round_block(m_max * s.topk * 4),
        "topk_weights": round_block(m_max * s.topk * 4),
    }
    if gating:
        out["gating"] = round_block(m_max * s.experts * s.dtype_bytes)
    return out


def repack_scratch(s: Shape) -> int:
    """Expert-by-expert repack: one expert's GPTQ source (all four tensors) plus the repack output of its
    w1, the larger of the two GEMM weights, live at once."""
    one_expert = sum(round_block(b // s.experts) for b in weight_tensor_bytes(s).values())
    one_w1 = weight_tensor_bytes(s)["w1"] // s.experts
    return one_expert + round_block(one_w1)


def torch_reference_scratch(m_max: int, s: Shape) -> int:
    """The torch backend dequantizes one routed expert at a time to fp32 and keeps fp32 activations."""
    w1 = s.hidden * 2 * s.intermediate * 4
    w2 = s.intermediate * s.hidden * 4
    unpack = w1 * 2                                   # int nibbles before scaling
    activations = m_max * s.topk * (2 * s.intermediate + s.hidden) * 4 + m_max * s.hidden * 4
    return w1 + w2 + unpack + activations


@dataclass(frozen=True)
class Estimate:
    weight_bytes: int
    workspace_bytes: int
    static_bytes: int
    per_m_bytes: int
    scratch_bytes: int
    peak_allocated_bytes: int
    copy_probe_bytes: int
    context_bytes: int
    required_bytes: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def estimate(s: Shape, batch_sizes: list[int], *, backend: str = "sglang-kernels", weights: str = "direct",
             sms: int = H200_SMS, order: str = "random") -> Estimate:
    """Peak allocated bytes of one benchmark run, and the free GPU memory it needs to start."""
    m_max = max(batch_sizes)
    wbytes = weight_bytes(s)
    workspace = round_block(sms * 4 * 4)
    static = sum(static_inputs(m_max, s, gating=backend == "sglang").values())
    buffers = [sum(per_m_buffers(m, s).values()) for m in batch_sizes]
    per_m = max(buffers) if order == "ascending" else sum(buffers)
    if backend == "torch":
        per_m = torch_reference_scratch(m_max, s)
    scratch = repack_scratch(s) if weights == "repack" else 0
    running = workspace + static + per_m
    peak = wbytes + max(running, scratch)
    required = max(peak + ALLOCATOR_SLACK_BYTES, COPY_PROBE_BYTES) + CONTEXT_BYTES
    return Estimate(wbytes, workspace, static, per_m, scratch, peak, COPY_PROBE_BYTES, CONTEXT_BYTES, required)


def shape_from_args(args: dict) -> Shape:
    """The job spec's payload.args mapping (YAML keys, lists or comma strings) → a Shape."""
    def get(key: str, default=None):
        value = args.get(key, args.get(key.replace("_", "-"), default))
        if value is None:
            raise KeyError(f"payload.args needs `{key}` to estimate GPU memory")
        return value

    dtype = str(get("dtype", "bf16"))
    return Shape(int(get("experts")), int(get("hidden")), int(get("intermediate")), int(get("topk")),
                 int(get("group_size")), DTYPE_BYTES.get(dtype, 2))


def batch_sizes_from_args(args: dict) -> list[int]:
    value = args.get("batch_sizes", args.get("batch-sizes", [1]))
    if isinstance(value, str):
        return [int(v) for v in value.split(",") if v.strip()]
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def estimate_from_args(args: dict) -> Estimate:
    backend = str(args.get("backend", "auto"))
    return estimate(shape_from_args(args), batch_sizes_from_args(args),
                    backend="sglang" if backend == "auto" else backend,
                    weights=str(args.get("weights", "direct")), order=str(args.get("order", "interleave")))
