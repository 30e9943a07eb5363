"""A benchmark's result.json for people: a table, and a plot (the Marlin benchmark's lever figure, or any
payload's time-like columns against its first numeric one); pure, matplotlib imported only to plot.

A result is whatever JSON a payload wrote, so nothing here trusts its shape: `render_checked` falls back to the
plain view (with a note saying why) when a payload's own table cannot be drawn from it, and every line of a
human view is clipped (`--json` prints the result whole).
"""
from __future__ import annotations

import io
import json
import math
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from remote_payload.sweep import label

from ..errors import NoResult, SpecError
from ..local_files import MAX_RESULT_BYTES, write_regular
from . import clocks
from .gate import finite_number

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["MAX_RESULT_BYTES", "finite_json", "json_text", "plot", "render_any", "render_checked", "strict_json"]
MAX_LINE = 1000  # characters of one line of a human view
MAX_CELL = 80  # characters of one cell or scalar of the plain view
MAX_ROWS = 500  # rows of one table of the plain view
INDENT_MAX = 1 << 20  # characters of `--json` output up to which it is indented
SHAPE_ERRORS = (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError)  # a field of the wrong type

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


def _cell(fmt: str, value: Any) -> str:
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
    clocked = _lever_at_clocks(result)
    if clocked:
        parts.append(clocked)
    return "\n\n".join(parts) + "\n"


def _lever_at_clocks(result: dict) -> str:
    """`lever(512) 11.32x at SM 1710–1740 MHz, …`: the largest batch size's lever beside the GPU clocks it was
    measured at (the start and end of the timed part); "" when the result recorded no clocks."""
    measured = clocks.describe(clocks.clocks_of(result))
    if not measured:
        return ""
    by_m = (result.get("lever") or {}).get("by_m") or {}
    sizes = [int(m) for m in by_m if str(m).isdigit()]
    lever = by_m[str(max(sizes))].get("lever") if sizes else None
    head = f"lever({max(sizes)}) {lever:.2f}x at " if isinstance(lever, (int, float)) else "GPU at "
    return head + measured + " (start and end of the timed part)"


def render_any(result: Any) -> str:
    """The payload's own table (the Marlin benchmark's, a sweep's) or the plain view; notes first."""
    text, notes = render_checked(result)
    return "".join(f"note: {note}\n" for note in notes) + text


def render_checked(result: Any) -> tuple[str, list[str]]:
    """(text, notes): the view of any JSON value, and why it is the plain view when a table was expected."""
    if not isinstance(result, dict):
        return _bounded(_render_value(result)), [f"the result is a JSON {_json_type(result)}, not an object: "
                                                  "shown as it is (`--json` prints it raw)"]
    payload = result.get("payload")
    special = {"bench_marlin_moe": render_table, "sweep": render_sweep}.get(payload) if isinstance(payload, str) else None
    notes = []
    if special is not None:
        try:
            return _bounded(special(result)), []
        except SHAPE_ERRORS as exc:
            notes.append(f"the {payload} table cannot be drawn from this result ({type(exc).__name__}: "
                         f"{_clip(str(exc), MAX_CELL)}); its fields are shown as they are")
    return _bounded(_render_plain(result)), notes


def _render_plain(result: dict) -> str:
    """Scalars as `key: value`, lists of rows as grids (at most MAX_ROWS rows each)."""
    scalars = [f"{key}: {_clip(_plain(value), MAX_CELL * 3)}" for key, value in result.items()
               if not isinstance(value, (dict, list))]
    grids = [f"{key}:\n" + _rows_grid(value) for key, value in result.items() if _is_rows(value)]
    return "\n\n".join(["\n".join(scalars)] + grids) + "\n"


def _render_value(value: Any) -> str:
    if _is_rows(value):
        return _rows_grid(value) + "\n"
    text = value if isinstance(value, str) else json.dumps(value, default=str)[:MAX_LINE * 2]
    return _clip(text, MAX_LINE) + "\n"


def _rows_grid(rows: list[dict]) -> str:
    columns = list(dict.fromkeys(key for row in rows[:MAX_ROWS] for key in row))
    grid = _grid([_clip(c, MAX_CELL) for c in columns],
                 [[_clip("-" if row.get(c) is None else _plain(row.get(c)), MAX_CELL) for c in columns]
                  for row in rows[:MAX_ROWS]])
    more = len(rows) - MAX_ROWS
    return grid + (f"\n… {more} more rows (`--json` prints them all)" if more > 0 else "")


def _json_type(value: Any) -> str:
    return {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string",
            list: "array"}.get(type(value), type(value).__name__)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit - 1]}… ({len(text):,} characters)"


def _bounded(text: str) -> str:
    """Every line at most MAX_LINE characters: one huge field must not flood a terminal or a tool's output."""
    return "\n".join(_clip(line, MAX_LINE) for line in text.split("\n"))


def render_sweep(result: dict) -> str:
    """One table across a sweep's variants: a variant column (its args), its status, the GPUs it ran on when
    the variants ran side by side, then each variant's rows (the Marlin benchmark's columns, or the union of
    any payload's first table of rows)."""
    variants = result.get("variants") or []
    outcomes = [_in_payload_order(v) for v in variants]
    marlin = any(o.get("payload") == "bench_marlin_moe" for o in outcomes)
    tables = [o.get("rows") if marlin else next((t for t in o.values() if _is_rows(t)), None) for o in outcomes]
    if marlin:
        columns: list[tuple[str, str, str | None]] = [(h, key, fmt) for h, key, fmt in COLUMNS]
    else:
        keys = list(dict.fromkeys(k for t in tables if t for row in t for k in row))
        columns = [(k, k, None) for k in keys]
    summary = result.get("sweep") or {}
    side_by_side = isinstance(summary.get("slots"), list) and len(summary["slots"]) > 1  # sweep.gpus_per_variant
    rows = []
    for variant, table in zip(variants, tables):
        status = variant.get("status") if variant.get("status") == "skipped" else f"exit {variant.get('exit_code')}"
        head = [str(variant.get("index")), label(variant.get("args") or {}), status]
        if side_by_side:
            devices = variant.get("devices")
            head.append(",".join(map(str, devices)) if isinstance(devices, list) else "-")
        for row in table or [{}]:
            rows.append(head + [(_cell(fmt, row.get(key)) if fmt else ("-" if row.get(key) is None else _plain(row[key])))
                                for _, key, fmt in columns])
    lines = [f"sweep: {summary.get('succeeded', '?')} succeeded, {summary.get('failed', '?')} failed, "
             f"{summary.get('skipped', '?')} skipped of {summary.get('variants', len(variants))} variants"]
    lines += [f"variant {v['index']} skipped: {v.get('reason')}" for v in variants if v.get("status") == "skipped"]
    lines += [_left_on_host(v) for v in variants if isinstance(v.get("result_file"), dict)]
    return "\n".join(lines) + "\n\n" + _grid(["#", "variant", "status", *(["GPU"] if side_by_side else []),
                                             *(h for h, _, _ in columns)], rows) + "\n"


def _left_on_host(variant: dict) -> str:
    """What a sweep's record lists instead of inlining a variant's result: where it stays, how large, why."""
    kept = variant["result_file"]
    size = f"{kept['bytes'] / (1 << 20):.1f} MB" if isinstance(kept.get("bytes"), int) else "size unknown"
    digest = f", sha256 {str(kept['sha256'])[:16]}…" if kept.get("sha256") else ""
    return (f"variant {variant.get('index')}: its result was left on the host in the job dir's "
            f"{_clip(str(kept.get('name')), MAX_CELL)} ({size}{digest}): {_clip(str(kept.get('why')), MAX_CELL * 3)}")


def _in_payload_order(variant: dict) -> dict:
    """A variant's result with its rows' keys in the order the payload wrote them (`columns`)."""
    outcome, columns = variant.get("result") or {}, variant.get("columns") or []
    return {key: [{**{c: row[c] for c in columns if c in row}, **row} for row in value] if _is_rows(value) else value
            for key, value in outcome.items()}


def _is_rows(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(row, dict) for row in value)


def _plain(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)[:MAX_LINE]
    return str(value)


def finite_json(value: Any) -> tuple[Any, int]:
    """(a copy of `value` with every NaN and ±Infinity as None, how many were replaced): strict JSON for
    `--json` (Python reads and writes NaN; most parsers refuse it). Iterative: a deep result is no problem."""
    replaced = 0

    def leaf(v: Any) -> Any:
        nonlocal replaced
        if isinstance(v, float) and not math.isfinite(v):
            replaced += 1
            return None
        return v

    def shell(v: Any) -> Any:
        return {} if isinstance(v, dict) else [] if isinstance(v, list) else None

    top = shell(value)
    if top is None:
        return leaf(value), replaced
    todo = [(value, top)]
    while todo:
        source, copy = todo.pop()
        for key, child in (source.items() if isinstance(source, dict) else enumerate(source)):
            inner = shell(child)
            if inner is None:
                inner = leaf(child)
            else:
                todo.append((child, inner))
            if isinstance(copy, dict):
                copy[key] = inner
            else:
                copy.append(inner)
    return top, replaced


def strict_json(value: Any) -> Any:
    return finite_json(value)[0]


def json_text(value: Any) -> tuple[str, int]:
    """(`value` as strict JSON text, how many NaN/Infinity became null): indented like every `--json` when
    at most INDENT_MAX characters, on one line above (json's indenting encoder is pure Python: 10 s for a
    28 MB result, against 1 s for the C one)."""
    replaced = 0
    try:
        text = json.dumps(value, sort_keys=True, allow_nan=False)
    except ValueError:  # NaN or Infinity somewhere: copy only then
        value, replaced = finite_json(value)
        text = json.dumps(value, sort_keys=True, allow_nan=False)
    if len(text) <= INDENT_MAX:
        text = json.dumps(value, indent=1, sort_keys=True, allow_nan=False)
    return text, replaced


def plot(result: Any, path: str | Path) -> Path:
    """The lever figure for the Marlin benchmark; a generic rows figure for any other payload. NoResult
    saying why when the result holds nothing that can be drawn."""
    if not isinstance(result, dict):
        raise NoResult(f"nothing to plot: the result is a JSON {_json_type(result)}, not an object")
    payload = result.get("payload")
    figure = (plot_sweep if payload == "sweep" else
              plot_lever if payload == "bench_marlin_moe" or _is_lever_rows(result.get("rows")) else None)
    if figure is None:
        return plot_rows(result, path)
    try:
        return figure(result, path)
    except SHAPE_ERRORS as exc:
        pyplot().close("all")  # the half-drawn figure
        raise NoResult(f"nothing to plot: the {payload or 'lever'} figure cannot be drawn from this result "
                       f"({type(exc).__name__}: {_clip(str(exc), MAX_CELL)})") from None


def _is_lever_rows(rows: Any) -> bool:
    return _is_rows(rows) and all(_is_lever_row(row) for row in rows)


def _is_lever_row(row: dict) -> bool:
    return all(finite_number(row.get(key)) for key in ("m", "us_per_token", "lever"))


TIME_UNITS = frozenset(("ns", "us", "ms", "s", "sec", "seconds"))


def axis_groups(columns: list[str]) -> list[list[str]]:
    """The y columns by axis: the time-like ones together (`median_us`, `p90_ms`, `wall_s`, `us_per_call`; not a
    rate like `tokens_per_s`), every other column on an axis of its own: a count such as the demo's `samples`
    never lands on a latency axis, and every column is drawn."""
    timed = [c for c in columns if _is_time(c)]
    return ([timed] if timed else []) + [[c] for c in columns if c not in timed]


def _is_time(column: str) -> bool:
    words = column.split("_")
    return words[0] in TIME_UNITS or (words[-1] in TIME_UNITS and "per" not in words)


def plottable_series(result: dict) -> tuple[str, str, list[str], list[dict]]:
    """(table key, x column, y columns, rows) of the first list of rows with numeric columns.

    x is the first column whose values are all numbers; every other all-numeric column is a y series.
    Raises NoResult saying why when nothing can be drawn.
    """
    tables = [(key, value) for key, value in result.items() if _is_rows(value)]
    if not tables:
        raise NoResult("nothing to plot: the result has no list of rows (e.g. `rows: [{size: 1, median_us: …}]`)")
    for key, rows in tables:
        numeric = [col for col in rows[0] if all(finite_number(row.get(col)) for row in rows)]
        if len(numeric) >= 2:
            return key, numeric[0], numeric[1:], rows
    raise NoResult(f"nothing to plot: no list of rows in the result has two numeric columns "
                   f"(tables: {', '.join(key for key, _ in tables)})")


def pyplot() -> ModuleType:
    """matplotlib's pyplot on the Agg backend (files, no display), imported only when a plot is asked for;
    SpecError (exit 2) naming the `plot` extra when matplotlib is not installed."""
    try:
        import matplotlib
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "matplotlib":
            raise
        raise SpecError("plotting needs matplotlib (the `plot` extra)", hint="pip install 'runner[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Every figure alike: tight layout, 120 dpi, then closed (a long-lived caller keeps no figures).
    Rendered in memory, then written only to a regular file (a FIFO as the path would block the write)."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    try:
        fig.tight_layout()
        fig.savefig(buffer, dpi=120, format=Path(path).suffix[1:].lower() or "png")
    except ValueError as exc:  # an image format matplotlib does not write
        raise SpecError(f"{path}: cannot plot: {_clip(str(exc), MAX_LINE)}",
                        hint="name the file .png, .svg or .pdf") from None
    finally:
        plt.close(fig)
    write_regular(path, buffer.getvalue(), "a plot")
    return Path(path)


def plot_rows(result: dict, path: str | Path) -> Path:
    """Each numeric column of the first table of rows against its first numeric column, one panel per axis
    (axis_groups), sharing x; log axes where all values are > 0."""
    key, x, ys, rows = plottable_series(result)
    groups = axis_groups(ys)
    plt = pyplot()

    rows = sorted(rows, key=lambda r: r[x])
    fig, axes = plt.subplots(len(groups), 1, figsize=(7.5, 1.5 + 3 * len(groups)), sharex=True, squeeze=False)
    for ax, group in zip(axes[:, 0], groups):
        for y in group:
            ax.plot([r[x] for r in rows], [r[y] for r in rows], "o-", label=y)
        if all(r[y] > 0 for r in rows for y in group):
            ax.set(yscale="log")
        ax.set(ylabel=", ".join(group))
        ax.legend()
    if all(r[x] > 0 for r in rows):
        axes[0][0].set(xscale="log")
    axes[-1][0].set(xlabel=x)
    axes[0][0].set(title=f"{_clip(str(result.get('payload', 'result')), MAX_CELL)}: {key} by {x}")
    return save_figure(fig, path)


def plot_lever(result: dict, path: str | Path) -> Path:
    """µs per token (left axis, log) and lever with its per-repetition range (right axis) against M."""
    plt = pyplot()
    import matplotlib.ticker

    rows = result.get("rows")
    rows = sorted((r for r in rows if isinstance(r, dict) and _is_lever_row(r)) if isinstance(rows, list) else [],
                  key=lambda r: r["m"])
    if not rows:
        raise NoResult("nothing to plot: the result has no timing rows"
                       + (f" ({_clip(str(result['error']), MAX_CELL)})" if result.get("error") else ""))
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
    lever.set_ylabel(f"lever = cost/token at M={ms[0]} ÷ at M")
    env, backend = result.get("environment") or {}, result.get("backend") or {}
    timing = (result.get("timing") or {}).get("used", "?")
    cost.set_title(f"Marlin int4 MoE on {env.get('gpu', '?')}: {backend.get('used', '?')}, {timing} timing")
    fig.legend(loc="upper center", bbox_to_anchor=(0.5, 0.88), ncol=2)
    return save_figure(fig, path)


def plot_sweep(result: dict, path: str | Path) -> Path:
    """One curve per variant, labelled by its args: the Marlin benchmark's µs/token and lever against M, or
    any payload's first numeric column against its x."""
    curves = [(label(v.get("args") or {}), _in_payload_order(v)) for v in result.get("variants") or [] if v.get("result")]
    if not curves:
        raise NoResult("nothing to plot: no variant of the sweep wrote a result")
    plt = pyplot()

    lever = all(_is_lever_rows(r.get("rows")) for _, r in curves)
    fig, axes = plt.subplots(1, 2 if lever else 1, figsize=(12 if lever else 7.5, 4.5), squeeze=False)
    for name, outcome in curves:
        if lever:
            rows = sorted(outcome["rows"], key=lambda r: r["m"])
            axes[0][0].plot([r["m"] for r in rows], [r["us_per_token"] for r in rows], "o-", label=name)
            axes[0][1].plot([r["m"] for r in rows], [r["lever"] for r in rows], "s-", label=name)
        else:
            _, x, ys, rows = plottable_series(outcome)
            y = axis_groups(ys)[0][0]
            rows = sorted(rows, key=lambda r: r[x])
            axes[0][0].plot([r[x] for r in rows], [r[y] for r in rows], "o-", label=name)
            axes[0][0].set(xlabel=x, ylabel=y)
    if lever:
        axes[0][0].set(xscale="log", yscale="log", xlabel="batch size M (tokens)", ylabel="µs per token")
        axes[0][1].set(xscale="log", xlabel="batch size M (tokens)", ylabel="lever (cost/token at smallest M ÷ at M)")
    for ax in axes[0]:
        ax.legend(fontsize=8)
    fig.suptitle(f"sweep: one curve per variant ({len(curves)})")
    return save_figure(fig, path)
