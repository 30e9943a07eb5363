"""Render a benchmark's result.json for people: a text table, and a plot of µs/token and lever vs batch size.

Pure functions of the parsed result; matplotlib is an optional extra, imported only when plotting.
`plot` draws any payload's rows: the Marlin benchmark's lever figure, or for other payloads each numeric
column against the first one.
"""
from __future__ import annotations

from pathlib import Path

from .errors import NoResult

COLUMNS = (  # header, row key, format
    ("M", "m", "{:d}"),
    ("median µs", "median_us", "{:.1f}"),
    ("p10 µs", "p10_us", "{:.1f}"),
    ("p90 µs", "p90_us", "{:.1f}"),
    ("µs/token", "us_per_token", "{:.2f}"),
    ("tokens/s", "tokens_per_s", "{:,.0f}"),
    ("experts", "distinct_experts", "{:.1f}"),
    ("GB/s", "expert_gb_per_s", "{:.0f}"),
    ("of copy", "copy_fraction", "{:.0%}"),
    ("lever", "lever", "{:.2f}x"),
    ("spread", "lever_spread", "{:.1%}"),
    ("lever 95% CI", "lever_ci95", "{0[0]:.2f}-{0[1]:.2f}"),
    ("capped", "capped_windows", "{:d}"),
)


def _cell(fmt: str, value) -> str:
    return "-" if value is None else fmt.format(value)


def _grid(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def _summary(result: dict) -> list[str]:
    env = result.get("environment") or {}
    backend = result.get("backend") or {}
    jit = result.get("jit") or {}
    memory = result.get("memory") or {}
    timing = result.get("timing") or {}
    lines = [f"{env.get('gpu') or env.get('device', '?')} · torch {env.get('torch', '?')} · "
             f"sglang {env.get('sglang') or '-'} · backend {backend.get('used', '?')} ({backend.get('why', '')})"]
    if jit:
        lines.append(f"JIT {jit.get('state')}: first call {jit.get('first_call_s', 0):.1f} s"
                     + (f", compile {jit['compile_s']:.0f} s" if jit.get("compile_s") else ""))
    if "peak_allocated_bytes" in memory:
        lines.append(f"memory: peak {memory['peak_allocated_bytes'] / 1e9:.2f} GB = "
                     f"{memory['peak_over_weights']:.3f} x weights ({memory['weight_bytes'] / 1e9:.2f} GB); "
                     f"estimate {memory['estimate_over_peak']:.3f} x peak")
    copy = result.get("copy_bandwidth")
    if copy:
        lines.append(f"copy bandwidth {copy['bytes_per_s'] / 1e12:.2f} TB/s ({copy['counted']})")
    if timing:
        lines.append(f"timing {timing.get('used')} · {timing.get('repeats')} repeats x {timing.get('iterations')} calls")
        lines += _schedule(timing)
    floor = result.get("floor")
    if floor:
        lines.append(f"M={floor['m']}: {floor['measured_us']:.1f} µs = {floor['over_floor']:.2f} x the "
                     f"{floor['floor_us']:.1f} µs floor (distinct expert bytes / copy bandwidth)")
    return lines


def _schedule(timing: dict) -> list[str]:
    """The window schedule the lever depends on: order, settle, and how many windows ran under a cap."""
    order, settle = timing.get("order") or {}, timing.get("settle") or {}
    if not order:
        return []
    line = f"windows: order {order.get('mode')} (seed {order.get('seed')}) · settle {settle.get('mode', 'none')}"
    if settle.get("mode") not in (None, "none"):
        line += f" {settle.get('ms', 0):.0f} ms"
    if timing.get("capped_windows") is not None:
        line += f" · {timing['capped_windows']} of {len(order.get('windows') or [])} windows under a power/thermal cap"
    return [line + " · spread: (max-min)/median of the per-repetition levers; CI: bootstrap over windows"]


def _check_table(check: dict) -> str:
    header = ["M", "eager rel err", "graph rel err", "ok"]
    rows = [[str(r["m"]), _cell("{:.2e}", r["eager"]["rel_err"]),
             _cell("{:.2e}", r.get("graph", {}).get("rel_err")), "yes" if r["ok"] else "NO"] for r in check["rows"]]
    verdict = "PASSED" if check["passed"] else "FAILED"
    return f"check {verdict} (tolerance {check['tolerance']:.0e})\n" + _grid(header, rows)


def render_table(result: dict) -> str:
    """The summary lines, then one line per batch size (or the check's rows; or the error)."""
    parts = ["\n".join(_summary(result))]
    if result.get("error"):
        parts.append(f"error: {result['error']}")
    if result.get("check"):
        parts.append(_check_table(result["check"]))
    rows = result.get("rows") or []
    if rows:
        header = [h for h, _, _ in COLUMNS]
        parts.append(_grid(header, [[_cell(fmt, row.get(key)) for _, key, fmt in COLUMNS] for row in rows]))
    return "\n\n".join(parts) + "\n"


def render_any(result: dict) -> str:
    """The Marlin benchmark's table, or for any other payload: scalars as `key: value`, lists of rows as grids."""
    if result.get("payload") == "bench_marlin_moe":
        return render_table(result)
    scalars = [f"{key}: {value}" for key, value in result.items() if not isinstance(value, (dict, list))]
    grids = [f"{key}:\n" + _grid(list(value[0]), [[_plain(row.get(col)) for col in value[0]] for row in value])
             for key, value in result.items() if _is_rows(value)]
    return "\n\n".join(["\n".join(scalars)] + grids) + "\n"


def _is_rows(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(row, dict) for row in value)


def _plain(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def plot(result: dict, path: str | Path) -> Path:
    """The lever figure for the Marlin benchmark; a generic rows figure for any other payload."""
    if result.get("payload") == "bench_marlin_moe" or _is_lever_rows(result.get("rows")):
        return plot_lever(result, path)
    return plot_rows(result, path)


def _is_lever_rows(rows) -> bool:
    return _is_rows(rows) and all("m" in row and "us_per_token" in row and "lever" in row for row in rows)


def plottable_series(result: dict) -> tuple[str, str, list[str], list[dict]]:
    """(table key, x column, y columns, rows) of the first list of rows with numeric columns.

    x is the first column whose values are all numbers; every other all-numeric column is a y series.
    Raises NoResult saying why when nothing can be drawn.
    """
    tables = [(key, value) for key, value in result.items() if _is_rows(value)]
    if not tables:
        raise NoResult("nothing to plot: the result has no list of rows (e.g. `rows: [{size: 1, median_us: …}]`)")
    for key, rows in tables:
        numeric = [col for col in rows[0] if all(_is_number(row.get(col)) for row in rows)]
        if len(numeric) >= 2:
            return key, numeric[0], numeric[1:], rows
    raise NoResult(f"nothing to plot: no list of rows in the result has two numeric columns "
                   f"(tables: {', '.join(key for key, _ in tables)})")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def plot_rows(result: dict, path: str | Path) -> Path:
    """Each numeric column of the first table of rows against its first numeric column (log axes when all > 0)."""
    key, x, ys, rows = plottable_series(result)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(rows, key=lambda r: r[x])
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for y in ys:
        ax.plot([r[x] for r in rows], [r[y] for r in rows], "o-", label=y)
    values = [r[c] for r in rows for c in (x, *ys)]
    if all(v > 0 for v in values):
        ax.set(xscale="log", yscale="log")
    ax.set(xlabel=x, ylabel=", ".join(ys), title=f"{result.get('payload', 'result')}: {key} by {x}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_lever(result: dict, path: str | Path) -> Path:
    """µs per token (left axis, log) and lever with its per-repetition range (right axis) against M."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = sorted(result.get("rows") or [], key=lambda r: r["m"])
    if not rows:
        raise NoResult("nothing to plot: the result has no timing rows" + (f" ({result['error']})" if result.get("error") else ""))
    ms = [r["m"] for r in rows]
    fig, cost = plt.subplots(figsize=(7.5, 4.5))
    cost.plot(ms, [r["us_per_token"] for r in rows], "o-", color="tab:blue", label="µs per token")
    cost.set(xscale="log", yscale="log", xlabel="batch size M (tokens)", ylabel="µs per token")
    cost.set_xticks(ms, [str(m) for m in ms])
    cost.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    cost.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    cost.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    lever = cost.twinx()
    levers = [r["lever"] for r in rows]
    bounds = [r.get("lever_ci95") or [min(r.get("rep_levers") or [r["lever"]]), max(r.get("rep_levers") or [r["lever"]])]
              for r in rows]
    low = [r["lever"] - b[0] for r, b in zip(rows, bounds)]
    high = [b[1] - r["lever"] for r, b in zip(rows, bounds)]
    ci = all(r.get("lever_ci95") for r in rows)
    lever.errorbar(ms, levers, yerr=[low, high], fmt="s-", color="tab:red", capsize=3,
                   label="lever (bars: bootstrap 95% CI)" if ci else "lever (bars: repetition range)")
    lever.set_ylabel("lever = cost/token at M=%d ÷ at M" % ms[0])
    env, backend = result.get("environment") or {}, result.get("backend") or {}
    timing = (result.get("timing") or {}).get("used", "?")
    cost.set_title(f"Marlin int4 MoE on {env.get('gpu', '?')}: {backend.get('used', '?')}, {timing} timing")
    fig.legend(loc="upper center", bbox_to_anchor=(0.5, 0.88), ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
