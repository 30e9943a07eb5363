"""One line per result.json: lever(512), its per-repetition values, the within-run spread, the bootstrap
interval, capped windows, M=1 and M=512 µs, and (for --settle cool) the idle time spent cooling.
    python3 results/h200/summarize.py results/h200/run4/*.json"""
import json
import statistics
import sys

print("| run | order/settle | M=1 µs | M=512 µs | lever(512) | per-rep lever(512) | within-run spread | 95% CI | capped windows | cooling idle s |")
print("|---|---|---|---|---|---|---|---|---|---|")
for path in sys.argv[1:]:
    r = json.load(open(path))
    rows = {row["m"]: row for row in r.get("rows", [])}
    if 512 not in rows:
        continue
    top, t = rows[512], r["timing"]
    cooled = [w["cooled"]["waited_ms"] for row in rows.values() for w in row.get("windows", []) if w.get("cooled")]
    name = path.rsplit("/", 1)[-1].removesuffix(".json")
    print("| %s | %s/%s | %.1f | %.0f | %.2f | %s | %.1f%% | %.2f-%.2f | %s | %s |" % (
        name, t["order"]["mode"], t["settle"]["mode"], rows[1]["median_us"], top["median_us"], top["lever"],
        ", ".join("%.2f" % v for v in top["rep_levers"]), 100 * top["lever_spread"], top["lever_ci95"][0],
        top["lever_ci95"][1], t.get("capped_windows"), "%.1f" % (sum(cooled) / 1000) if cooled else "-"))
