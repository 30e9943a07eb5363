"""docs/reliability.md from one test run: the fault matrix (pass/fail, service downtime), bad input, tests.

    rm -f /tmp/cases.jsonl*; RUNNER_CASE_REPORT=/tmp/cases.jsonl python -m pytest -p tests.reliability_report \\
        tests/integration/test_service.py tests/integration/test_restore_past_our_own_processes.py tests/integration/test_pid1.py tests/integration/test_faults.py tests/integration/test_concurrency.py \\
        tests/integration/test_bad_input.py -q; \\
    python -m tests.reliability_report /tmp/cases.jsonl > docs/reliability.md

Three things end up in the files next to $RUNNER_CASE_REPORT:
- rows of `tests.case_report.record` (one per fault case: job state, service before/after, downtime);
- rows of `record_bad_input` in the same file, marked `"kind": "bad-input"`, with every key a
  case_report row has, so `python -m tests.case_report` still renders the file;
- with `-p tests.reliability_report` (this module as a pytest plugin), FILE.tests: each test's start time
  and outcome. A row belongs to the test that was running when it was written, so a case whose test
  failed after recording its row is shown failed, and a failed test that recorded nothing still appears.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

HOSTILE_INPUT = Path(__file__).with_name("hostile_input.md")

COMMAND = ("rm -f /tmp/cases.jsonl*; RUNNER_CASE_REPORT=/tmp/cases.jsonl python -m pytest -p tests.reliability_report "
           "tests/integration/test_service.py tests/integration/test_restore_past_our_own_processes.py tests/integration/test_pid1.py tests/integration/test_faults.py tests/integration/test_concurrency.py "
           "tests/integration/test_bad_input.py -q; "
           "python -m tests.reliability_report /tmp/cases.jsonl > docs/reliability.md")


def _append(path: str, row: dict) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")


def record_bad_input(case: str, exit_code: int, named: bool, connections: int, message: str) -> None:
    """One bad-input case: its exit code, whether the message named the field, connections the host saw."""
    path = os.environ.get("RUNNER_CASE_REPORT")
    if not path:
        return
    ok = exit_code == 2 and named and connections == 0
    _append(path, {"kind": "bad-input", "case": case, "state": f"exit {exit_code}", "expected": "exit 2",
                   "was": None, "now": f"{connections} connections", "healthy": ok, "downtime_s": None,
                   "message": message.strip().splitlines()[0] if message.strip() else "", "note": "",
                   "at": time.time()})


# -- pytest plugin: when each test ran and how it ended ---------------------------------------------------

def pytest_runtest_logstart(nodeid, location):
    path = os.environ.get("RUNNER_CASE_REPORT")
    if path:
        _append(path + ".tests", {"nodeid": nodeid, "event": "start", "at": time.time()})


def pytest_runtest_logreport(report):
    path = os.environ.get("RUNNER_CASE_REPORT")
    failed_outside_call = report.when != "call" and report.outcome != "passed"
    if path and (report.when == "call" or failed_outside_call):
        outcome = "xfailed" if hasattr(report, "wasxfail") and report.outcome == "skipped" else report.outcome
        _append(path + ".tests", {"nodeid": report.nodeid, "event": report.when, "outcome": outcome,
                                  "duration": report.duration, "at": time.time()})


# -- the report -------------------------------------------------------------------------------------------

def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def outcomes_by_test(events: list[dict]) -> dict[str, dict]:
    """nodeid -> {start, outcome, duration}; a failure in setup or teardown wins over a passed call."""
    tests: dict[str, dict] = {}
    for event in events:
        test = tests.setdefault(event["nodeid"], {"start": event["at"], "outcome": "passed", "duration": 0.0})
        if event["event"] == "start":
            test["start"] = event["at"]
        elif test["outcome"] == "passed" or event["outcome"] == "failed":
            test["outcome"] = event["outcome"]
            test["duration"] += event.get("duration", 0.0)
    return tests


def owner_of(row: dict, tests: dict[str, dict]) -> str | None:
    """The test that was running when the row was written: the last one started before it."""
    started = [(test["start"], nodeid) for nodeid, test in tests.items() if test["start"] <= row["at"]]
    return max(started)[1] if started else None


def row_passed(row: dict, outcome: str | None) -> bool:
    """The test's verdict when known (a case may expect a failed service); else case_report's rule."""
    if outcome is not None:
        return outcome == "passed"
    return row["state"] == row["expected"] and bool(row["healthy"])


def cell(text) -> str:
    return str(text or "").replace("|", "\\|").replace("\n", " ")[:120]


def fault_table(rows: list[dict], tests: dict[str, dict]) -> list[str]:
    lines = ["| | case | test | job state (expected) | service was → now | healthy | downtime s | message |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        nodeid = owner_of(row, tests)
        outcome = tests[nodeid]["outcome"] if nodeid else None
        downtime = "-" if row["downtime_s"] is None else f"{row['downtime_s']:.2f}"
        lines.append(f"| {'✅' if row_passed(row, outcome) else '❌'} | {cell(row['case'])} "
                     f"| `{(nodeid or '?').split('::')[-1]}` {outcome or ''} | {row['state']} ({row['expected']}) "
                     f"| {row['was'] or '-'} → {row['now']} | {'yes' if row['healthy'] else 'NO'} | {downtime} "
                     f"| {cell(row['message'] or row['note'])} |")
    return lines


def unrecorded_failures(rows: list[dict], tests: dict[str, dict]) -> list[str]:
    owners = {owner_of(row, tests) for row in rows}
    return [f"- ❌ `{nodeid}` {test['outcome']} before recording a row" for nodeid, test in tests.items()
            if test["outcome"] != "passed" and nodeid not in owners]


def bad_input_section(rows: list[dict]) -> list[str]:
    good = [r for r in rows if r["healthy"]]
    lines = [f"{len(good)} of {len(rows)} bad-input cases (spec files and command-line arguments, "
             "tests/integration/test_bad_input.py) exit 2 with a message naming the field, and the host saw 0 connections "
             "(a recording ProxyCommand logs every attempt; the positive control's valid submit is logged)."]
    for row in rows:
        if not row["healthy"]:
            lines.append(f"- ❌ {cell(row['case'])}: {row['state']}, {row['now']}: {cell(row['message'])}")
    return lines


def summary(tests: dict[str, dict]) -> str:
    counts: dict[str, int] = {}
    for test in tests.values():
        counts[test["outcome"]] = counts.get(test["outcome"], 0) + 1
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "no test outcomes recorded"


def render(path: Path) -> str:
    rows = read_rows(path)
    tests = outcomes_by_test(read_rows(Path(str(path) + ".tests")))
    faults = [r for r in rows if r.get("kind") != "bad-input"]
    bad = [r for r in rows if r.get("kind") == "bad-input"]
    generated = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(min((r["at"] for r in rows), default=time.time())))
    lines = ["# Reliability evidence", "",
             f"Generated from one test run ({generated}); tests: {summary(tests)}. Regenerate with:", "",
             "```", COMMAND, "```", "",
             "## Fault matrix", "",
             "One row per case: the job's final state (expected), the service before → after (read from systemd "
             "on the host, not from status.json), health of its URL, and the service's downtime as status.json "
             "measured it (`-`: the job did not stop the service). ✅/❌ is the test's verdict: it asserts the "
             "expected state and, except where the case is a service that cannot come back (reported, "
             "`healthy` NO by design), an active and healthy service. Cases are in tests/integration/test_service.py "
             "(loopback sshd), "
             "tests/integration/test_faults.py (a host in its own network namespace, link cuts by iptables DROP) and "
             "tests/integration/test_concurrency.py.", "",
             *fault_table(faults, tests), ""]
    missing = unrecorded_failures(rows, tests)
    if missing:
        lines += ["Failed tests without a row:", "", *missing, ""]
    lines += ["## Bad input", "", *bad_input_section(bad), ""]
    # The hostile-input table names cases spread over many test files, each proven by its own test: kept by
    # hand beside this module and appended, so regenerating the page never drops it.
    lines += ["", HOSTILE_INPUT.read_text().rstrip("\n"), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(Path(sys.argv[1])))
