"""A fleet run's results, hosts side by side: one column per host, and one curve per host on a plot.

Pure functions of the hosts' parsed result.json files (matplotlib only when plotting). The series is the
one results.py would plot first (`plottable_series`: x is the first numeric column of the first table of
rows), with `median_us` preferred as y when a payload reports it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import NoResult
from .results import MAX_CELL, _clip, _grid, _plain, axis_groups, plottable_series, pyplot, save_figure

PREFERRED_Y = "median_us"


def _series(result: dict) -> tuple[str, str, str, dict] | None:
    """(table, x, y, {x value: y value}) of one host's result, or None when it has no plottable rows."""
    try:
        table, x, ys, rows = plottable_series(result)
    except NoResult:
        return None
    y = PREFERRED_Y if PREFERRED_Y in ys else axis_groups(ys)[0][0]
    return table, x, y, {row[x]: row[y] for row in rows}


def side_by_side(results: dict[str, dict], missing: dict[str, str]) -> str:
    """Scalars (one row per key), then the series (one row per x value), one column per host; then why a
    host has no result."""
    results = {host: _as_object(r) for host, r in results.items()}
    hosts = list(results)
    parts = []
    scalars = list(dict.fromkeys(k for r in results.values() for k, v in r.items() if not isinstance(v, (dict, list))))
    if scalars:
        parts.append(_grid(["", *hosts], [[_clip(key, MAX_CELL), *(_clip(_plain(results[h].get(key, "-")), MAX_CELL)
                                                                for h in hosts)] for key in scalars]))
    series = {h: s for h in hosts if (s := _series(results[h])) is not None}
    if series:
        table, x, y, _ = next(iter(series.values()))
        xs = sorted({value for s in series.values() for value in s[3]})
        rows = [[_plain(v), *(_plain(series[h][3][v]) if h in series and v in series[h][3] else "-" for h in hosts)]
                for v in xs]
        parts.append(f"{table}: {y} by {x}\n" + _grid([x, *hosts], rows))
    parts += [f"{host}: no result ({why})" for host, why in missing.items()]
    return "\n\n".join(parts) + "\n"


def _as_object(result: Any) -> dict:
    """A host's result that is not a JSON object (a payload wrote a list, a string) as `{result: value}`."""
    return result if isinstance(result, dict) else {"result": result}


def plot_hosts(results: dict[str, dict], path: str | Path) -> Path:
    """One curve per host of the series side_by_side shows (log axes when every value is positive)."""
    series = {h: s for h, r in results.items() if (s := _series(_as_object(r))) is not None}
    if not series:
        raise NoResult("nothing to plot: no host's result has a list of rows with two numeric columns")
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for host, (_, _, _, points) in series.items():
        xs = sorted(points)
        ax.plot(xs, [points[v] for v in xs], "o-", label=host)
    table, x, y, _ = next(iter(series.values()))
    if all(v > 0 for _, _, _, p in series.values() for pair in p.items() for v in pair):
        ax.set(xscale="log", yscale="log")
    ax.set(xlabel=x, ylabel=y, title=f"{table}: {y} by {x}, one curve per host")
    ax.legend()
    return save_figure(fig, path)
