"""Timing that can be trusted: rotated routing and inputs, CUDA-graph replay, repeats with their spread.

Per batch size the benchmark keeps static input tensors; before every timed call it copies the next of
ROTATION_SETS routing sets (device) and inputs (pinned host memory) into them. The copies are enqueued
before the start event, so they are outside the timed region, and the rotation keeps one set's experts
from sitting in L2 across calls. Graph mode captures one CUDA graph of the whole MoE call and times
g.replay(); eager mode times the call itself.
"""
from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
from marlin_estimate import Shape

ROTATION_SETS = 16
WARMUP_CALLS = 10
COPY_PROBE_ELEMENTS = 256 * (1 << 20) // 4      # 256 MiB of float32, source and destination
# NVML clock-event reasons that mean a cap held the clock down: software power cap 0x4, hardware slowdown
# 0x8, software thermal 0x20, hardware thermal 0x40, hardware power brake 0x80 (nvml.h)
CAP_REASONS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


@dataclass
class Statics:
    """The tensors a captured graph reads: views of the largest-M buffers, refilled before each call."""
    x: torch.Tensor
    topk_w: torch.Tensor
    topk_ids: torch.Tensor


@dataclass
class RotationSets:
    x: list[torch.Tensor]           # host (pinned when the device is CUDA)
    topk_w: list[torch.Tensor]      # device
    topk_ids: list[torch.Tensor]    # device
    distinct_experts: list[int]

    def load(self, j: int, statics: Statics) -> None:
        statics.x.copy_(self.x[j], non_blocking=True)
        statics.topk_w.copy_(self.topk_w[j])
        statics.topk_ids.copy_(self.topk_ids[j])


def zipf_popularity(experts: int, skew: float, gen: torch.Generator) -> torch.Tensor:
    """Expert probabilities ∝ 1/rank^skew, ranks shuffled so the popular experts are not the first ids."""
    ranks = torch.randperm(experts, generator=gen).to(torch.float64) + 1.0
    weights = ranks.pow(-skew)
    return weights / weights.sum()


def routing(m: int, s: Shape, kind: str, skew: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """m tokens' top-k distinct expert ids (int32) and normalised float32 weights, on the CPU."""
    if kind == "zipf":
        popularity = zipf_popularity(s.experts, skew, gen).expand(m, s.experts).contiguous()
        ids = torch.multinomial(popularity, s.topk, replacement=False, generator=gen)
    else:
        ids = torch.rand(m, s.experts, generator=gen).topk(s.topk, dim=1).indices
    weights = torch.rand(m, s.topk, generator=gen, dtype=torch.float32) + 0.1
    return weights / weights.sum(dim=1, keepdim=True), ids.to(torch.int32)


def rotation_sets(m: int, s: Shape, kind: str, skew: float, dtype: torch.dtype, device: str,
                  gen: torch.Generator, n_sets: int = ROTATION_SETS) -> RotationSets:
    pin = device.startswith("cuda")
    xs, ws, ids, distinct = [], [], [], []
    for _ in range(n_sets):
        w, i = routing(m, s, kind, skew, gen)
        x = torch.randn(m, s.hidden, generator=gen).to(dtype)
        xs.append(x.pin_memory() if pin else x)
        ws.append(w.to(device))
        ids.append(i.to(device))
        distinct.append(int(torch.unique(i).numel()))
    return RotationSets(xs, ws, ids, distinct)


def static_views(m: int, full: Statics) -> Statics:
    return Statics(full.x[:m], full.topk_w[:m], full.topk_ids[:m])


def allocate_statics(m_max: int, s: Shape, dtype: torch.dtype, device: str) -> Statics:
    return Statics(torch.zeros(m_max, s.hidden, dtype=dtype, device=device),
                   torch.zeros(m_max, s.topk, dtype=torch.float32, device=device),
                   torch.zeros(m_max, s.topk, dtype=torch.int32, device=device))


Call = Callable[[], object]


def capture_graph(call: Call) -> tuple[torch.cuda.CUDAGraph, object]:
    """Warm the call up on a side stream (lazy inits must not happen during capture), then capture it.
    Returns the graph and the call's output as captured: replay rewrites that tensor in place."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = call()
    torch.cuda.synchronize()
    return graph, output


class Window:
    """One batch size ready to time: its call (a graph replay or the eager call), rotation sets and statics.
    Windows of different batch sizes can be timed in any order; each keeps its own place in the rotation."""

    def __init__(self, call: Call, sets: RotationSets, statics: Statics, cuda: bool):
        self.call, self.sets, self.statics, self.cuda = call, sets, statics, cuda
        self.counter = 0

    def step(self) -> None:
        self.sets.load(self.counter % len(self.sets.x), self.statics)
        self.counter += 1
        self.call()

    def warm_up(self, calls: int = WARMUP_CALLS) -> None:
        for _ in range(calls):
            self.step()

    def settle(self, mode: str, ms: float) -> None:
        """Before a timed window: `idle` lets the card cool for ms; `busy` runs this window's own call, untimed,
        for ms, so each window starts at the clock and power its own load settles to, not its predecessor's."""
        if mode == "none" or ms <= 0:
            return
        self.synchronize()
        deadline = time.perf_counter() + ms / 1000.0
        if mode == "idle":
            time.sleep(ms / 1000.0)
            return
        while time.perf_counter() < deadline:
            self.step()
            self.synchronize()

    def time(self, iterations: int, gpu_state: Callable[[], dict] | None = None) -> tuple[list[float], dict | None]:
        """`iterations` timings in µs, and the GPU's state read while they are still queued (the host runs ahead)."""
        timer = CudaTimer() if self.cuda else HostTimer()
        for _ in range(iterations):
            self.sets.load(self.counter % len(self.sets.x), self.statics)
            self.counter += 1
            timer.time(self.call)
        state = gpu_state() if gpu_state else None
        return timer.results_us(), state

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def nvml_sampler(torch_module) -> Callable[[], dict] | None:
    """SM clock, power, temperature and clock-event reasons of this process's GPU, or None without NVML."""
    try:
        import pynvml
        pynvml.nvmlInit()
        uuid = str(torch_module.cuda.get_device_properties(0).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception:  # NVML is optional: no sampler, no gpu_state in the rows
        return None
    reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons

    def sample() -> dict:
        bits = reasons(handle)
        return {"sm_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                "temp_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
                "clock_event_reasons": hex(bits), "capped": bool(bits & CAP_REASONS)}
    return sample


class CudaTimer:
    """Events around each call, read once after the repetition: no host sync between calls."""
    def __init__(self):
        self.pairs = []

    def time(self, call: Call) -> None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        self.pairs.append((start, end))

    def results_us(self) -> list[float]:
        torch.cuda.synchronize()
        return [a.elapsed_time(b) * 1000.0 for a, b in self.pairs]


class HostTimer:
    def __init__(self):
        self.samples = []

    def time(self, call: Call) -> None:
        began = time.perf_counter()
        call()
        self.samples.append((time.perf_counter() - began) * 1e6)

    def results_us(self) -> list[float]:
        return self.samples


def copy_bandwidth(device: str, repeats: int = 20) -> dict:
    """Device-to-device copy rate, counting bytes read plus written (the notes' 4.3 TB/s convention)."""
    src = torch.empty(COPY_PROBE_ELEMENTS, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    timer = CudaTimer()
    for _ in range(repeats):
        timer.time(functools.partial(dst.copy_, src))
    seconds = statistics.median(timer.results_us()) * 1e-6
    moved = 2 * src.numel() * src.element_size()
    del src, dst
    torch.cuda.empty_cache()
    return {"bytes_per_s": moved / seconds, "bytes_moved": moved, "median_us": seconds * 1e6,
            "counted": "read + write", "repeats": repeats}
