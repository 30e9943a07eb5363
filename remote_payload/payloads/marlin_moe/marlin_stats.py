"""Rows and levers from raw timings (pure Python: the result schema is tested without torch).

lever(M) = per-token cost at the base batch size ÷ per-token cost at M: how many times more tokens a
second the same weights serve when M tokens share one pass over them. Its spread comes from levers
computed repetition by repetition (repetition r of the base against repetition r of M), and its 95%
interval from a bootstrap over the timed windows (each window: one batch size, one repetition).

The order of the windows: `ascending` times every repetition of M=1, then of M=2, … (the old order: a
power cap that sets in as the card heats lands on the large batch sizes, the ones the lever divides by);
`random` and `alternating` time every batch size once per repetition, in a seeded shuffle or ascending and
descending in turn, so drift spreads over all batch sizes.
"""
from __future__ import annotations

import random
import statistics

ORDERS = ("random", "alternating", "ascending", "interleave")
BOOTSTRAP_RESAMPLES = 2000


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def relative_spread(values: list[float]) -> float:
    """(max - min) / median: the figure the issue's ≤ 5% target is stated in."""
    return (max(values) - min(values)) / statistics.median(values)


def window_order(batch_sizes: list[int], repeats: int, order: str, seed: int) -> list[tuple[int, int]]:
    """(repetition, m) in the order the windows are timed."""
    if order == "ascending":
        return [(r, m) for m in batch_sizes for r in range(repeats)]
    if order == "interleave":  # light, heavy, light, …: every M has the same neighbours in every repetition
        ranked = sorted(batch_sizes)
        pairs = [ranked[i // 2] if i % 2 == 0 else ranked[-1 - i // 2] for i in range(len(ranked))]
        return [(r, m) for r in range(repeats) for m in pairs]
    rng = random.Random(seed)
    windows = []
    for r in range(repeats):
        sizes = list(batch_sizes)
        if order == "random":
            rng.shuffle(sizes)
        elif r % 2:
            sizes.reverse()
        windows += [(r, m) for m in sizes]
    return windows


def bootstrap_lever(base_windows: list[float], m_windows: list[float], scale: float, seed: int = 0,
                    resamples: int = BOOTSTRAP_RESAMPLES) -> list[float]:
    """2.5th and 97.5th percentile of the lever when the windows' medians of the base and of M are drawn
    again with replacement (each side on its own)."""
    rng = random.Random(seed)
    levers = []
    for _ in range(resamples):
        base = statistics.median(rng.choices(base_windows, k=len(base_windows)))
        at_m = statistics.median(rng.choices(m_windows, k=len(m_windows)))
        levers.append(base / at_m * scale)
    return [percentile(levers, 0.025), percentile(levers, 0.975)]


def timing_row(m: int, repetitions: list[list[float]], distinct_experts: list[int], expert_bytes: float,
               copy_bytes_per_s: float | None) -> dict:
    samples = [t for rep in repetitions for t in rep]
    median_us = statistics.median(samples)
    distinct = statistics.mean(distinct_experts)
    bytes_per_s = distinct * expert_bytes / (median_us * 1e-6)
    return {
        "m": m,
        "median_us": median_us,
        "p10_us": percentile(samples, 0.10),
        "p90_us": percentile(samples, 0.90),
        "rep_median_us": [statistics.median(rep) for rep in repetitions],
        "samples": len(samples),
        "us_per_token": median_us / m,
        "tokens_per_s": m / (median_us * 1e-6),
        "distinct_experts": distinct,
        "expert_gb_per_s": bytes_per_s / 1e9,
        "copy_fraction": bytes_per_s / copy_bytes_per_s if copy_bytes_per_s else None,
    }


def add_levers(rows: list[dict]) -> list[dict]:
    """Lever of every row against the smallest batch size, with the per-repetition levers and spread."""
    base = min(rows, key=lambda r: r["m"])
    for row in rows:
        scale = row["m"] / base["m"]
        row["lever"] = base["median_us"] / row["median_us"] * scale
        per_rep = [b / r * scale for b, r in zip(base["rep_median_us"], row["rep_median_us"])]
        row["rep_levers"] = per_rep
        row["lever_spread"] = relative_spread(per_rep)
        row["lever_ci95"] = bootstrap_lever(base["rep_median_us"], row["rep_median_us"], scale, seed=row["m"])
    return rows


def lever_summary(rows: list[dict]) -> dict:
    base = min(rows, key=lambda r: r["m"])
    return {"base_m": base["m"],
            "by_m": {str(r["m"]): {"lever": r["lever"], "min": min(r["rep_levers"]), "max": max(r["rep_levers"]),
                                   "spread": r["lever_spread"], "ci95": r["lever_ci95"],
                                   "capped_windows": r.get("capped_windows")} for r in rows},
            "ci": f"bootstrap over windows, {BOOTSTRAP_RESAMPLES} resamples, 2.5-97.5 percentile"}


def floor_us(distinct_experts: float, expert_bytes: float, copy_bytes_per_s: float) -> float:
    """The fastest the distinct experts' bytes can stream in at the measured copy rate."""
    return distinct_experts * expert_bytes / copy_bytes_per_s * 1e6
