"""The regression gate's verdicts as text, GitHub markdown (for $GITHUB_STEP_SUMMARY) or JUnit XML.

Pure: verdicts in, a string out. JUnit has one testcase per metric; a regression or a missing metric is a
<failure>, an improvement or a new metric passes with a note in system-out.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

from .clocks import clock_lines
from .gate import FAILING, Metric, Verdict, label

HEADER = ["metric", "baseline", "current", "worse by", "allowed", "verdict"]


def render(verdicts: list[Verdict], fmt: str, *, baseline: str, current: str, tolerance: float,
           notes: Sequence[str] = ()) -> str:
    """notes: lines under the summary (the clocks each side was measured at, clocks.clock_lines)."""
    if fmt == "junit":
        return junit(verdicts, baseline=baseline, current=current, notes=notes)
    rows = [_cells(v) for v in verdicts]
    summary = _summary(verdicts, baseline=baseline, current=current, tolerance=tolerance)
    if fmt == "markdown":
        return _markdown(rows, "\n\n".join([summary, *notes]))
    return _text(rows, "\n".join([summary, *notes]))


def _cells(v: Verdict) -> list[str]:
    return [label(v.name), metric_text(v.baseline), metric_text(v.current), _percent(v.change, signed=True),
            _percent(v.allowed, prefix="±"), v.verdict.upper() if v.failed else v.verdict]


def metric_text(m: Metric | None) -> str:
    if m is None:
        return "-"
    return f"{m.value:.4g}" + (f" ±{m.spread:.1%}" if m.spread else "")


def _percent(value: float | None, *, signed: bool = False, prefix: str = "") -> str:
    if value is None:
        return "-"
    if signed and abs(value) < 0.0005:
        return "0.0%"  # never "-0.0%"
    return prefix + (f"{value:+.1%}" if signed else f"{value:.1%}")


def _summary(verdicts: list[Verdict], *, baseline: str, current: str, tolerance: float) -> str:
    failed = [v for v in verdicts if v.failed]
    head = f"gate {current} against {baseline} (tolerance {tolerance:.1%} + each metric's measured spread): "
    if not failed:
        return head + f"PASSED, {len(verdicts)} metrics"
    return head + "FAILED: " + ", ".join(f"{label(v.name)} {v.verdict}" for v in failed)


def _text(rows: list[list[str]], summary: str) -> str:
    return "\n".join([summary, "", *_aligned(HEADER, rows)]) + "\n"


def _aligned(header: list[str], rows: list[list[str]]) -> list[str]:
    """The metric name left, the numbers right, each column as wide as its widest cell."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
            for row in [header, *rows]]


def _markdown(rows: list[list[str]], summary: str) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(" ".join(c.replace("|", "\\|").splitlines()) for c in cells) + " |"

    marked = [[f"**{c}**" if r[-1].lower() in FAILING and i == len(r) - 1 else c for i, c in enumerate(r)]
              for r in rows]
    table = [line(HEADER), "|" + "|".join([":--"] + ["--:"] * (len(HEADER) - 1)) + "|", *map(line, marked)]
    return "\n".join([f"### Benchmark gate\n\n{summary}\n", *table]) + "\n"


def junit(verdicts: list[Verdict], *, baseline: str, current: str, notes: Sequence[str] = ()) -> str:
    failures = sum(v.failed for v in verdicts)
    suites = ET.Element("testsuites", name="runner gate", tests=str(len(verdicts)), failures=str(failures))
    suite = ET.SubElement(suites, "testsuite", name=f"gate {current} vs {baseline}", tests=str(len(verdicts)),
                          failures=str(failures), errors="0", skipped="0")
    if notes:
        ET.SubElement(suite, "system-out").text = "\n".join(notes)
    for v in verdicts:
        case = ET.SubElement(suite, "testcase", classname="runner.gate", name=label(v.name))
        detail = _detail(v)
        if v.failed:
            ET.SubElement(case, "failure", message=f"{label(v.name)}: {v.verdict}: {detail}", type=v.verdict).text = detail
        else:
            ET.SubElement(case, "system-out").text = f"{v.verdict}: {detail}"
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _detail(v: Verdict) -> str:
    if v.verdict == FAILING[1]:
        return f"in the baseline ({metric_text(v.baseline)}) but not in this result"
    if v.baseline is None:
        return f"not in the baseline (current {metric_text(v.current)})"
    return (f"baseline {metric_text(v.baseline)}, current {metric_text(v.current)}, worse by {_percent(v.change, signed=True)}, "
            f"allowed {_percent(v.allowed, prefix='±')}")


def side_by_side(a: dict, b: dict, verdicts: list[Verdict], *, name_a: str, name_b: str) -> str:
    """Two runs: their environments, then each metric of either with the change from A to B."""
    env_lines = [f"{tag}: {name}: {_environment(result)}" for tag, name, result in (("A", name_a, a), ("B", name_b, b))]
    env_lines += clock_lines(a, b, names=("A", "B"))
    header = ["metric", "A", "B", "B worse by", "verdict"]
    rows = [[label(v.name), metric_text(v.baseline), metric_text(v.current), _percent(v.change, signed=True), v.verdict]
            for v in verdicts]
    return "\n".join([*env_lines, "", *_aligned(header, rows)]) + "\n"


def _environment(result: Any) -> str:
    env = result.get("environment") if isinstance(result, dict) else None
    if not isinstance(env, dict):
        return "environment not recorded"
    parts = [env.get("gpu") or env.get("device"), env.get("driver") and f"driver {env['driver']}",
             env.get("torch") and f"torch {env['torch']}", env.get("sglang") and f"sglang {env['sglang']}"]
    return " · ".join(str(p)[:80] for p in parts if p) or "environment not recorded"
