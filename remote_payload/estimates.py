"""Peak GPU memory of a payload, from its job-spec args alone: the controller's `gpu.min_free_mib: auto`.

A registry from payload script name to a pure function (args mapping → bytes). Nothing here imports torch:
the controller imports this module on a machine that has no GPU stack.
"""
from __future__ import annotations

from typing import Callable, Mapping

from .marlin_estimate import estimate_from_args


def _marlin_moe_required_bytes(args: Mapping) -> int:
    return estimate_from_args(dict(args)).required_bytes


ESTIMATORS: dict[str, Callable[[Mapping], int]] = {
    "bench_marlin_moe.py": _marlin_moe_required_bytes,
}


def estimate_peak_bytes(script_name: str, args: Mapping | None) -> int | None:
    """Bytes the payload needs free on its GPU, or None when the script has no estimator."""
    estimator = ESTIMATORS.get(script_name)
    return None if estimator is None else estimator(args or {})
