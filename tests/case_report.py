"""Record one row per reliability case (state, service before/after, downtime) for docs/reliability.md.

Tests call `record(case, job_status, ...)`; rows go to the JSON-lines file named by $RUNNER_CASE_REPORT
(nothing is written when it is unset). `python -m tests.case_report FILE > docs/reliability.md` renders them.
"""
from __future__ import annotations

import json
import os
import sys
import time


def record(case: str, job: dict | None, *, expected: str, service_now: str, healthy: bool, note: str = "") -> None:
    path = os.environ.get("RUNNER_CASE_REPORT")
    if not path:
        return
    service = (job or {}).get("service") or {}
    row = {"case": case, "state": (job or {}).get("state", "-"), "expected": expected,
           "was": service.get("was"), "now": service_now, "healthy": healthy,
           "downtime_s": service.get("downtime_s"), "message": (job or {}).get("message", ""), "note": note,
           "at": time.time()}
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")


def render(rows: list[dict]) -> str:
    lines = ["| case | job state (expected) | service was → now | healthy | downtime s | message |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        downtime = "-" if r["downtime_s"] is None else f"{r['downtime_s']:.2f}"
        ok = "✅" if r["state"] == r["expected"] and r["healthy"] else "❌"
        message = (r["message"] or r["note"] or "").replace("|", "\\|").replace("\n", " ")[:110]
        lines.append(f"| {ok} {r['case']} | {r['state']} ({r['expected']}) | {r['was'] or '-'} → {r['now']} "
                     f"| {'yes' if r['healthy'] else 'NO'} | {downtime} | {message} |")
    return "\n".join(lines)


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        print(render([json.loads(line) for line in fh if line.strip()]))
