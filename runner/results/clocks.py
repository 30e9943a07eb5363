"""The GPU's clocks a result was measured at: the payload's `gpu_clocks` record ({gpu, source, start, end},
each end {index, sm_mhz, mem_mhz, temp_c, power_limit_w} or null; the Marlin benchmark writes it from
nvidia-smi around its timed part) as one line for people, and whether two results ran at different clocks.

Two runs were measured at different clocks when their SM clocks (the mean of each run's start and end)
differ by more than CLOCK_DIFFERENCE of the lower one, or their power limits differ: a note beside the gate,
never a failure (the lever follows the SM clock; the gate's tolerance is the judge of the numbers).
Pure functions of parsed JSON; nothing here trusts the record's shape.
"""
from __future__ import annotations

import math
from typing import Any

CLOCK_DIFFERENCE = 0.02  # SM clocks further apart than 2% of the lower one: "measured at different clocks"
KEYS = ("sm_mhz", "mem_mhz", "temp_c", "power_limit_w")


def clocks_of(result: Any) -> dict[str, list[float]]:
    """{key: [start, end] readings that are finite numbers} of a result's gpu_clocks; {} when it has none."""
    record = result.get("gpu_clocks") if isinstance(result, dict) else None
    if not isinstance(record, dict):
        return {}
    ends = [record.get(end) for end in ("start", "end")]
    readings = {key: [e[key] for e in ends if isinstance(e, dict) and _finite(e.get(key))] for key in KEYS}
    return {key: values for key, values in readings.items() if values}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def describe(clocks: dict[str, list[float]]) -> str:
    """`SM 1710–1740 MHz, memory 3201 MHz, 53–60 °C, 700 W limit`; "" when nothing was recorded."""
    parts = [_span(clocks.get("sm_mhz"), "SM {} MHz"), _span(clocks.get("mem_mhz"), "memory {} MHz"),
             _span(clocks.get("temp_c"), "{} °C"), _span(clocks.get("power_limit_w"), "{} W limit")]
    return ", ".join(p for p in parts if p)


def _span(values: list[float] | None, template: str) -> str:
    if not values:
        return ""
    low, high = min(values), max(values)
    return template.format(f"{low:.0f}" if round(low) == round(high) else f"{low:.0f}–{high:.0f}")


def different_clocks(a: dict[str, list[float]], b: dict[str, list[float]]) -> str | None:
    """Why runs A and B were measured at different clocks, or None (also when either recorded none)."""
    reasons = []
    sm_a, sm_b = _mean(a.get("sm_mhz")), _mean(b.get("sm_mhz"))
    if sm_a and sm_b and abs(sm_a - sm_b) / min(sm_a, sm_b) > CLOCK_DIFFERENCE:
        reasons.append(f"SM clocks differ by {abs(sm_a - sm_b) / min(sm_a, sm_b):.1%} "
                       f"(more than {CLOCK_DIFFERENCE:.0%})")
    limit_a, limit_b = _mean(a.get("power_limit_w")), _mean(b.get("power_limit_w"))
    if limit_a and limit_b and round(limit_a) != round(limit_b):
        reasons.append(f"power limits differ ({limit_a:.0f} W, {limit_b:.0f} W)")
    return "; ".join(reasons) or None


def _mean(values: list[float] | None) -> float | None:
    return sum(values) / len(values) if values else None


def recorded(result: Any) -> dict | None:
    """A result's gpu_clocks as a baseline keeps it ({start, end}, finite numbers of KEYS only), or None."""
    record = result.get("gpu_clocks") if isinstance(result, dict) else None
    if not isinstance(record, dict) or not clocks_of(result):
        return None
    return {end: {k: v for k, v in record[end].items() if k in KEYS and _finite(v)}
            if isinstance(record.get(end), dict) else None for end in ("start", "end")}


def clock_lines(baseline: Any, current: Any, *, names: tuple[str, str] = ("baseline", "this run")) -> list[str]:
    """The gate's lines: each side's clocks, then a note when they differ; [] when neither recorded any."""
    a, b = clocks_of(baseline), clocks_of(current)
    if not a and not b:
        return []
    lines = [f"clocks: {names[0]} {describe(a) or 'not recorded'} · {names[1]} {describe(b) or 'not recorded'}"]
    why = different_clocks(a, b)
    if why:
        lines.append(f"note: measured at different clocks: {why}; the levers follow the SM clock, so compare "
                     "them with that in mind (not a failure)")
    return lines
