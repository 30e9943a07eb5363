"""Int4 MoE weights for the benchmark: GPTQ and Marlin layouts, random or known values, and dequantization.

Layouts (E experts, K hidden, N intermediate, g group size; int4 packed 8 to an int32):
    GPTQ    w1 [E, K/8, 2N]   w2 [E, N/8, K]    scales [E, K/g, 2N] and [E, N/g, K]
    Marlin  w1 [E, K/16, 4N]  w2 [E, N/16, 2K]  the same scales, columns permuted within chunks of 64
Weights are symmetric uint4b8: a nibble q stands for (q - 8) * scale. w1's first N output columns are the
gate, the next N the up projection (silu_and_mul's order).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from marlin_estimate import Shape

NIBBLES = 8          # int4 values per int32
SCALE_CHUNK = 64     # Marlin permutes grouped scales within chunks of 64 columns


@dataclass
class MoeWeights:
    layout: str                 # "marlin" or "gptq"
    w1: torch.Tensor
    w2: torch.Tensor
    s1: torch.Tensor
    s2: torch.Tensor

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.w1, self.w2, self.s1, self.s2))


def generator(device: str, seed: int) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def random_bits(shape: tuple, device: str, gen: torch.Generator) -> torch.Tensor:
    """Any int32 is a valid pack of 8 uint4b8 nibbles: every nibble decodes to a finite value."""
    return torch.randint(-2**31, 2**31 - 1, shape, dtype=torch.int32, device=device, generator=gen)


def random_scales(shape: tuple, dtype: torch.dtype, device: str, gen: torch.Generator,
                  low: float = 1e-3, high: float = 1e-2) -> torch.Tensor:
    """Finite, small, positive; drawn straight in the target dtype (an fp32 draw would add ~1.4 GB at peak)."""
    return torch.empty(shape, dtype=dtype, device=device).uniform_(low, high, generator=gen)


def layout_shapes(s: Shape, layout: str) -> dict[str, tuple]:
    e, k, n, g = s.experts, s.hidden, s.intermediate, s.group_size
    if layout == "marlin":
        w1, w2 = (e, k // 16, 4 * n), (e, n // 16, 2 * k)
    else:
        w1, w2 = (e, k // NIBBLES, 2 * n), (e, n // NIBBLES, k)
    return {"w1": w1, "w2": w2, "s1": (e, k // g, 2 * n), "s2": (e, n // g, k)}


def direct_weights(s: Shape, layout: str, dtype: torch.dtype, device: str, seed: int) -> MoeWeights:
    """Random bits straight in the target layout: the peak is the weights themselves."""
    gen = generator(device, seed)
    dims = layout_shapes(s, layout)
    return MoeWeights(layout, random_bits(dims["w1"], device, gen), random_bits(dims["w2"], device, gen),
                      random_scales(dims["s1"], dtype, device, gen), random_scales(dims["s2"], dtype, device, gen))


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """[..., K, N] nibbles 0..15 → [..., K/8, N] int32; value k = 8*row + i sits at bits 4i..4i+3."""
    *lead, k, n = q.shape
    grouped = q.to(torch.int64).reshape(*lead, k // NIBBLES, NIBBLES, n)
    shifts = (4 * torch.arange(NIBBLES, dtype=torch.int64, device=q.device)).view(NIBBLES, 1)
    packed = (grouped << shifts).sum(dim=-2)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)      # two's complement into int32
    return packed.to(torch.int32)


def unpack_int4(w: torch.Tensor) -> torch.Tensor:
    """[..., K/8, N] int32 → [..., K, N] nibbles 0..15 (inverse of pack_int4)."""
    *lead, rows, n = w.shape
    shifts = (4 * torch.arange(NIBBLES, dtype=torch.int32, device=w.device)).view(NIBBLES, 1)
    nibbles = (w.unsqueeze(-2) >> shifts) & 0xF
    return nibbles.reshape(*lead, rows * NIBBLES, n)


def dequantize(w: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """GPTQ int4 [..., K/8, N] with scales [..., K/g, N] → fp32 [..., K, N]."""
    values = unpack_int4(w).to(torch.float32) - 8.0
    return values * scales.to(torch.float32).repeat_interleave(group_size, dim=-2)


def known_gptq_weights(s: Shape, dtype: torch.dtype, device: str, seed: int) -> MoeWeights:
    """GPTQ weights whose nibbles and scales come from the seed; scales span 10x so a misplaced one shows."""
    gen = generator("cpu", seed)
    dims = layout_shapes(s, "gptq")

    def nibbles(packed_shape: tuple) -> torch.Tensor:
        e, rows, n = packed_shape
        return pack_int4(torch.randint(0, 16, (e, rows * NIBBLES, n), generator=gen))

    w1, w2 = nibbles(dims["w1"]), nibbles(dims["w2"])
    s1 = random_scales(dims["s1"], dtype, "cpu", gen, 2e-3, 2e-2)
    s2 = random_scales(dims["s2"], dtype, "cpu", gen, 2e-3, 2e-2)
    return MoeWeights("gptq", *(t.to(device) for t in (w1, w2, s1, s2)))


def marlin_scale_perm() -> list[int]:
    """Marlin's order for grouped scales inside each chunk of 64 columns: column 8*j + i goes to slot 8*i + j."""
    return [i + 8 * j for i in range(8) for j in range(8)]


def marlin_channelwise_scale_perm() -> list[int]:
    """The order Marlin uses when one group spans all of K (group_size >= size_k)."""
    return [2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)]


def permute_scales(scales: torch.Tensor, size_k: int, group_size: int, corrupt: bool = False) -> torch.Tensor:
    """One expert's scales [K/g, n] in Marlin's column order; `corrupt` keeps GPTQ order (a wrong layout)."""
    if corrupt:
        return scales.contiguous()
    perm = marlin_scale_perm() if group_size < size_k else marlin_channelwise_scale_perm()
    chunk = len(perm)
    return scales.reshape(-1, chunk)[:, perm].reshape(scales.shape).contiguous()


Repack = Callable[[torch.Tensor, torch.Tensor, int, int, int], torch.Tensor]


def empty_marlin(s: Shape, dtype: torch.dtype, device: str) -> MoeWeights:
    dims = layout_shapes(s, "marlin")
    return MoeWeights("marlin", torch.empty(dims["w1"], dtype=torch.int32, device=device),
                      torch.empty(dims["w2"], dtype=torch.int32, device=device),
                      torch.empty(dims["s1"], dtype=dtype, device=device),
                      torch.empty(dims["s2"], dtype=dtype, device=device))


def repack_expert(dest: MoeWeights, e: int, gptq: tuple[torch.Tensor, ...], s: Shape, repack: Repack,
                  corrupt_scales: bool) -> None:
    """GPTQ → Marlin for expert e, written into the preallocated destination (peak: one expert extra)."""
    w1, w2, s1, s2 = gptq
    no_perm = torch.empty(0, dtype=torch.int32, device=w1.device)    # no act-order
    k, n, g = s.hidden, s.intermediate, s.group_size
    dest.w1[e].copy_(repack(w1, no_perm, k, 2 * n, 4))
    dest.w2[e].copy_(repack(w2, no_perm, n, k, 4))
    dest.s1[e].copy_(permute_scales(s1, k, g, corrupt_scales))
    dest.s2[e].copy_(permute_scales(s2, n, g, corrupt_scales))


def repack_weights(gptq: MoeWeights, s: Shape, repack: Repack, corrupt_scales: bool = False) -> MoeWeights:
    """Whole GPTQ weights (small check shapes) → Marlin, expert by expert."""
    dest = empty_marlin(s, gptq.s1.dtype, str(gptq.w1.device))
    for e in range(s.experts):
        repack_expert(dest, e, (gptq.w1[e], gptq.w2[e], gptq.s1[e], gptq.s2[e]), s, repack, corrupt_scales)
    return dest


def random_repacked_weights(s: Shape, dtype: torch.dtype, device: str, seed: int, repack: Repack) -> MoeWeights:
    """Full-scale repack route: random GPTQ experts made one at a time and repacked into a preallocated
    destination, so the peak is the weights plus one expert rather than both layouts at once (~2x)."""
    gen = generator(device, seed)
    dims = layout_shapes(s, "gptq")
    dest = empty_marlin(s, dtype, device)
    for e in range(s.experts):
        expert = (random_bits(dims["w1"][1:], device, gen), random_bits(dims["w2"][1:], device, gen),
                  random_scales(dims["s1"][1:], dtype, device, gen), random_scales(dims["s2"][1:], dtype, device, gen))
        repack_expert(dest, e, expert, s, repack, corrupt_scales=False)
        del expert
    return dest
