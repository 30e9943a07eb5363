"""The results history for people: a table of recorded runs, and one metric plotted over the runs.

Pure functions of `history.Run` lists; matplotlib (the `plot` extra) is imported only when plotting.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ..errors import NoResult
from ..printable import printable
from .gate import label
from .gate_report import metric_text
from .history import Run
from .results import pyplot, save_figure

DEFAULT_METRIC = "lever_512"


def default_metric(known: list[str]) -> str:
    """The metric shown and plotted when none is asked for: lever_512 when recorded, else the first known
    (the demo payload records only median_us_N)."""
    return DEFAULT_METRIC if DEFAULT_METRIC in known or not known else known[0]


def render(runs: list[Run], metric: str | None, every: list[Run] | None = None) -> str:
    """The runs as a table; every: all recorded runs, which name the variants (so that a run's label does not
    depend on which runs a filter shows)."""
    if not runs:
        return "no recorded runs" + (f" with {metric}" if metric else "") + "\n"
    shown = metric or DEFAULT_METRIC
    header = ["submitted (UTC)", "job", "host", "gpu", "torch", "sglang", "git", "variant", label(shown)]
    variants = variant_labels(every or runs)
    rows = [[printable(str(cell), multiline=False) for cell in (
        time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.submitted_at or r.recorded_at)), run_name(r), r.host or "-",
        r.environment.get("gpu") or "-", r.environment.get("torch") or "-", r.environment.get("sglang") or "-",
        r.git_rev or "-", variants[_key(r)], metric_text(r.metrics.get(shown)))] for r in runs]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]) + "\n"


def run_name(run: Run) -> str:
    """The job id, and `#K` for a sweep's variant K (the index `runner results` shows)."""
    return f"{run.job_id}#{run.variant_index}" if run.variant_index else run.job_id


def _key(run: Run) -> str:
    return json.dumps(run.variant, sort_keys=True)


def variant_labels(runs: list[Run]) -> dict[str, str]:
    """Each distinct variant named by the arguments in which the variants differ (`default` if only one)."""
    variants = {_key(r): r.variant for r in runs}
    keys = sorted({k for v in variants.values() for k in v})
    differing = [k for k in keys if len({json.dumps(v.get(k), sort_keys=True) for v in variants.values()}) > 1]
    labels = {}
    for key, variant in variants.items():
        parts = [f"{k}={_short(variant.get(k))}" for k in differing if variant.get(k) != _mode(variants, k)]
        labels[key] = ", ".join(parts) or "default"
    return labels


def _mode(variants: dict[str, dict], key: str) -> Any:
    values = [json.dumps(v.get(key), sort_keys=True) for v in variants.values()]
    return json.loads(max(values, key=values.count))


def _short(value: Any) -> str:
    text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    return text if len(text) <= 24 else text[:21] + "…"


def plot(runs: list[Run], metric: str, path: str | Path, title: str = "", every: list[Run] | None = None) -> Path:
    """The metric over the recorded runs (oldest job first), one series per variant (named over `every`, as
    render does), spread as error bars."""
    points = [(i, r) for i, r in enumerate(runs) if metric in r.metrics]
    if not points:
        raise NoResult(f"nothing to plot: no recorded run has {metric}",
                       hint="`runner history` lists the runs; metric names look like lever_512, median_us_1")
    plt = pyplot()
    named = variant_labels(every or [r for _, r in points])
    labels = {key: named[key] for key in dict.fromkeys(_key(r) for _, r in points)}
    fig, ax = plt.subplots(figsize=(max(7.5, 0.45 * len(points) + 3), 4.8))
    for key, name in labels.items():
        series = [(i, r.metrics[metric]) for i, r in points if _key(r) == key]
        ax.errorbar([i for i, _ in series], [m.value for _, m in series],
                    yerr=[m.value * m.spread for _, m in series], fmt="o", capsize=3, label=name)
    ax.set_xticks([i for i, _ in points], [run_name(r) for _, r in points], rotation=60, ha="right", fontsize=8)
    direction = next(iter(points))[1].metrics[metric].direction
    ax.set(ylabel=f"{label(metric)} ({direction} is better)", xlabel="recorded runs, oldest first",
           title=title or f"{label(metric)} over recorded runs")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
