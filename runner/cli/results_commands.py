"""`runner results` and `runner history`: a job's result (a table, a plot, the regression gate, two runs side by
side) with its service window, and the results recorded over runs. Logic in commands/unattended.py, results/gate.py,
results/history.py; the text of a window in commands/render.py. cli.py adds these commands to its group.
"""
from __future__ import annotations

import sys
from dataclasses import asdict
from typing import Any

import click

from ..commands import render
from ..deadline import DEFAULT_MAX_WAIT_S, MAX_WAIT_LIMIT_S, Deadline
from ..errors import RunnerError, SpecError
from ..state.store import Store
from .cli_echo import emit_json as _emit_json
from .cli_echo import progress as _progress
from .cli_echo import say as _say


def _tolerance(_ctx: click.Context, _param: click.Parameter, value: str) -> float:
    from ..results.gate import parse_tolerance

    try:
        return parse_tolerance(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command(name="results", help="Fetch the job's result.json: a table, a lever plot, a regression gate "
                                  "against a baseline, or two runs side by side. ID is a job id, or a result.json "
                                  "path: one with a `/`, or an existing file that is no known job id (so "
                                  "`./run-7.json` for a file named like a job).\n\n"
                                  "Exit: 0 · 1 no result (the message says the job's state and why; a job that ended without one: "
                                  "the rows its log holds, if any) · 75 still "
                                  "running, call again · 2 · 3; "
                                  "with --baseline: 0 within, 1 regression or missing metric, 2 bad baseline.")
@click.argument("job_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print result.json as one JSON document, whatever its shape "
              "(strict JSON: NaN and Infinity as null; result.json files over 32 MB are refused).")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png", help="Plot the rows (the lever figure for the Marlin benchmark).")
@click.option("--baseline", "baseline_path", default=None, metavar="FILE", help="Gate against this baseline file.")
@click.option("--save-baseline", "save_path", default=None, metavar="FILE", help="Write this result's metrics as a baseline.")
@click.option("--compare", "other", default=None, metavar="ID2", help="Show ID and ID2 (id or result.json) side by side.")
@click.option("--tolerance", default="5%", callback=_tolerance, show_default=True,
              help="Allowed worsening on top of each metric's measured spread (5% or 0.05).")
@click.option("--format", "fmt", type=click.Choice(["text", "markdown", "junit"]), default="text", show_default=True,
              help="Gate output: a text table, GitHub markdown ($GITHUB_STEP_SUMMARY) or JUnit XML.")
@click.option("--max-wait", type=click.FloatRange(0, MAX_WAIT_LIMIT_S), default=DEFAULT_MAX_WAIT_S, show_default=True,
              help="Seconds this call may take, plus one round trip (then exit 3).")
def results(job_id: str, as_json: bool, plot_path: str | None, baseline_path: str | None, save_path: str | None,
            other: str | None, tolerance: float, fmt: str, max_wait: float) -> None:
    from ..commands import unattended
    from ..results import gate, gate_report
    from . import fleet_cli

    if Store().is_run(job_id) and not (baseline_path or save_path or other):
        sys.exit(fleet_cli.results(job_id, as_json=as_json, plot_path=plot_path,
                                   deadline=Deadline.for_command(max_wait)))
    store = Store()
    deadline = Deadline.for_command(max_wait)
    current = unattended.collect(job_id, store=store, deadline=deadline,
                                 partial=not (baseline_path or save_path or other))  # no gate on a part
    if current.window and not as_json:
        for line in render.window_lines(current.window):
            _progress(line)
    for note in (current.warning, current.partial):
        if note:
            _progress(f"runner: {note}")
    if save_path:
        document = gate.write_baseline(save_path, current.result, current.source, current.declared)
        _progress(f"wrote {save_path}: {len(document['metrics'])} metrics from {current.source}")
    if baseline_path:
        verdicts = unattended.gate_against(baseline_path, current, tolerance)
        notes = unattended.gate_clock_lines(baseline_path, current)
        _say(gate_report.render(verdicts, fmt, baseline=baseline_path, current=current.source,
                                tolerance=tolerance, notes=notes), nl=False)
        sys.exit(gate.exit_code(verdicts))
    if other:
        second = unattended.collect(other, store=store, deadline=deadline)
        verdicts = unattended.compare_runs(current, second, tolerance)
        _say(gate_report.side_by_side(current.result, second.result, verdicts,
                                      name_a=current.source, name_b=second.source), nl=False)
    elif as_json:
        _emit_result_json(current.result)
    elif not save_path:
        from ..results.results import render_checked

        text, notes = render_checked(current.result)
        for note in notes:
            _progress(f"runner: {note}")
        _say(text)
    if plot_path:
        from ..results.results import plot

        plot(current.result, plot_path)
        _progress(f"wrote {plot_path}")
    if current.partial:
        sys.exit(1)  # the job did not succeed, whatever rows it left


def _emit_result_json(result: Any) -> None:
    """result.json as strict JSON: NaN and ±Infinity (which Python writes, most parsers refuse) become null."""
    from ..results.results import json_text

    text, replaced = json_text(result)
    if replaced:
        _progress(f"runner: the result holds {replaced} NaN/Infinity values; --json prints them as null")
    click.echo(text)


@click.command(help="Recorded results (every `runner results ID` records one): list, or plot a metric over runs.")
@click.option("--host", default=None, help="Only runs on this host (the spec's host.address).")
@click.option("--metric", default=None, metavar="NAME", help="Only runs with this metric, shown in the table "
              "(e.g. lever_512, median_us_1, peak_over_weights; default column lever_512).")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png", help="Plot the metric (default lever_512).")
@click.option("--import", "imports", multiple=True, metavar="RESULT.json",
              help="Record result files first (job id = the path as given); repeatable.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def history(host: str | None, metric: str | None, plot_path: str | None, imports: tuple[str, ...],
            as_json: bool) -> None:
    from ..commands.unattended import collect
    from ..results import history as hist
    from ..results import history_report

    store = Store()
    path = hist.db_path(store.root)
    deadline = Deadline.for_command(DEFAULT_MAX_WAIT_S)  # an import of a job id asks its host
    for ref in imports:
        warning = hist.record(path, *hist.runs_from_result(ref, collect(ref, store=store, record=False,
                                                                        deadline=deadline).result))
        if warning:
            raise RunnerError(warning)
    known = hist.metric_names(path)
    if metric and known and metric not in known:
        raise SpecError(f"--metric {metric}: no recorded run has it; known metrics: {', '.join(known)}")
    shown = metric or history_report.default_metric(known)
    runs = hist.runs(path, host=host, metric=metric or (shown if plot_path else None))
    every = hist.runs(path) if runs else []  # the variants are named over all of them, whatever is shown
    if as_json:
        from ..results.results import strict_json

        _emit_json(strict_json([asdict(r) for r in runs]))
    else:
        _say(history_report.render(runs, shown if runs else metric, every), nl=False)
    if plot_path:
        if not metric and shown != history_report.DEFAULT_METRIC:
            _progress(f"plotting {shown}: no recorded run has {history_report.DEFAULT_METRIC} (--metric picks another)")
        history_report.plot(runs, shown, plot_path, every=every)
        _progress(f"wrote {plot_path}")
