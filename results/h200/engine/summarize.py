"""results.json + results.md from what measure.sh left in OUT: per job, the downtime parts runner recorded
(the host's status.json: service.downtime; a staged job's `stage` seconds, before the window), the unit's
MainPID before/after, nvidia-smi memory before the
window / during the payload / after, the first 200 of /health_generate after the payload, lever(512).
  python3 summarize.py OUT"""
import glob, json, os, statistics, sys

out = sys.argv[1]
samples = [json.loads(line) for line in open(os.path.join(out, "samples.jsonl"))] \
    if os.path.exists(os.path.join(out, "samples.jsonl")) else []
mem = [s for s in samples if s["k"] == "mem"]
hg = [s for s in samples if s["k"] == "hg"]
pids = [s for s in samples if s["k"] == "pid"]
PARTS = ("not_serving_s", "release_s", "drain_s", "payload_s", "resume_s", "health_s")


def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None


def lever512(result, output_log):
    """From the result (lever and its bootstrap CI), else from the output's row events (the same lever: median
    per-token cost at the smallest M / at 512) and window events (the per-repetition levers, of window medians)."""
    rows = (result or {}).get("rows") or []
    row = next((r for r in rows if r.get("m") == 512), None)
    if row:
        return row.get("lever"), row.get("lever_ci95"), row.get("rep_levers")
    try:
        events = [json.loads(line) for line in open(output_log) if line.startswith("{")]
    except OSError:
        return None, None, None
    medians = {e["m"]: e["median_us"] for e in events if e.get("event") == "row"}
    if 512 not in medians:
        return None, None, None
    base = min(medians)
    windows = {}
    for e in events:
        if e.get("event") == "window":
            windows.setdefault((e["rep"], e["m"]), []).append(e["median_us"])
    reps = sorted({r for r, _ in windows})
    per_rep = [statistics.median(windows[(r, base)]) / statistics.median(windows[(r, 512)]) * 512 / base
               for r in reps if (r, base) in windows and (r, 512) in windows]
    return medians[base] / medians[512] * 512 / base, None, per_rep


def job(pid_file):
    base = pid_file[: -len(".pids.json")]
    ids = load(pid_file)
    st = load(base + ".host-status.json") or {}
    service = st.get("service") or {}
    parts = service.get("downtime") or {}
    stopped, freed, restored = service.get("stopped_at"), service.get("freed_at"), service.get("restored_at")
    payload_end = freed + parts["payload_s"] if freed and parts.get("payload_s") is not None else None
    staged = bool(ids.get("staged"))
    row = {"job": ids["job"], "free": ids["free"], "staged": staged,
           "method": ids["free"] + ("+staged" if staged else ""), "state": st.get("state"),
           "prepare_s": (st.get("prepare") or {}).get("seconds"), "stage_s": (st.get("stage") or {}).get("seconds"),
           **{k: parts.get(k) for k in PARTS}, "downtime_s": service.get("downtime_s"),
           "released": [s["step"] for s in (service.get("released") or {}).get("steps", [])],
           "resumed_how": (service.get("resumed") or {}).get("how"),
           "main_pid_before": ids["pid_before"], "main_pid_after": ids["pid_after"],
           "main_pid_same": ids["pid_before"] == ids["pid_after"]}
    if stopped and freed and restored and payload_end:
        before = [m for m in mem if m["t"] < stopped]
        during = [m["used"] for m in mem if freed <= m["t"] <= payload_end]
        after = [m["used"] for m in mem if restored + 1 <= m["t"] <= restored + 4]
        row["mem_used_mib"] = {"before": before[-1]["used"] if before else None,
                               "during_payload_min": min(during) if during else None,
                               "during_payload_max": max(during) if during else None,
                               "after": statistics.median(after) if after else None}
        first = next((h for h in hg if h["t"] >= payload_end and h["code"] == 200), None)
        row["first_generate_after_payload_s"] = round(first["t"] + first["s"] - payload_end, 3) if first else None
        last_ok = [h for h in hg if h["t"] < stopped and h["code"] == 200]
        row["observed_outage_s"] = round(first["t"] + first["s"] - (last_ok[-1]["t"] + last_ok[-1]["s"]), 3) \
            if first and last_ok else None
        row["sampled_main_pids_in_window"] = sorted({p["pid"] for p in pids if stopped - 1 <= p["t"] <= restored + 1})
    row["lever512"], row["lever512_ci95"], row["lever512_reps"] = lever512(load(base + ".result.json"),
                                                                           base + ".output.log")
    row["cold"] = (row["prepare_s"] or 0) > 60  # the prepare step compiled the Marlin GEMM (~5-6 min)
    return row


def order(path):
    return int(os.path.basename(path).split("-")[0][1:])


jobs = [job(p) for p in sorted(glob.glob(os.path.join(out, "jobs", "*.pids.json")), key=order)]
summary = {}
for method in dict.fromkeys(j["method"] for j in jobs):
    warm = [j for j in jobs if not j["cold"] and j["method"] == method and j["state"] == "SUCCEEDED"]
    summary[method] = {"warm_jobs": len(warm), **{
        k: round(statistics.mean(v), 3) if v else None
        for k in ("stage_s",) + PARTS + ("first_generate_after_payload_s", "observed_outage_s", "lever512")
        for v in [[j[k] for j in warm if j.get(k) is not None]]}}
json.dump({"jobs": jobs, "mean_of_warm_jobs": summary}, open(os.path.join(out, "results.json"), "w"), indent=1)


def f(v, fmt="{:.2f}"):
    return "—" if v is None else fmt.format(v)


lines = ["| job | free | staged | state | prepare s | stage s | not serving s | release s | drain s | payload s | resume s | health s "
         "| MainPID before → after | GPU MiB used before / payload (min–max) / after | 1st generate after payload s "
         "| outage seen by prober s | lever(512) [95% CI] |", "|" + "---|" * 17]
for j in jobs:
    m = j.get("mem_used_mib") or {}
    ci = j.get("lever512_ci95")
    lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s → %s%s | %s / %s–%s / %s | %s | %s | %s%s |" % (
        j["job"], j["free"], "yes" if j["staged"] else "no", j["state"], f(j["prepare_s"], "{:.1f}"),
        f(j["stage_s"]), f(j["not_serving_s"]), f(j["release_s"]),
        f(j["drain_s"]), f(j["payload_s"]), f(j["resume_s"]), f(j["health_s"]), j["main_pid_before"],
        j["main_pid_after"], " (same)" if j["main_pid_same"] else "", f(m.get("before"), "{:.0f}"),
        f(m.get("during_payload_min"), "{:.0f}"), f(m.get("during_payload_max"), "{:.0f}"), f(m.get("after"), "{:.0f}"),
        f(j.get("first_generate_after_payload_s")), f(j.get("observed_outage_s")), f(j["lever512"]),
        " [%.2f–%.2f]" % tuple(ci) if ci else " (reps %s)" % "/".join("%.2f" % v for v in j["lever512_reps"])
        if j.get("lever512_reps") else ""))
lines += ["", "Mean over the warm jobs (a cold job's prepare step compiled the Marlin GEMM; the window is not affected):", "",
          "| method | jobs | stage s | not serving s | release s | drain s | payload s | resume s | health s | 1st generate after "
          "payload s | outage seen by prober s | lever(512) |", "|" + "---|" * 12]
for method, s in summary.items():
    lines.append("| %s | %d | %s |" % (method, s["warm_jobs"], " | ".join(
        f(s[k]) for k in ("stage_s",) + PARTS + ("first_generate_after_payload_s", "observed_outage_s", "lever512"))))


def clients_and_clocks(j):
    """What the clients saw (load.py report: in flight at the pause / arrived in the window, complete-truncated-
    failed) and the GPU's SM clock at the start → end of the timed part (the result's gpu_clocks)."""
    base = os.path.join(out, "jobs", j["job"])
    try:
        report = json.loads(open(base + ".clients.json").readline())
    except (OSError, ValueError):
        report = {}

    def fate(key):
        x = report.get(key) or {}
        return "%s/%s/%s of %s" % (x.get("complete"), x.get("truncated"), x.get("failed"), x.get("n")) if x else "—"
    clocks = (load(base + ".result.json") or {}).get("gpu_clocks") or {}
    ends = [clocks.get(k) or {} for k in ("start", "end")]
    sm = "→".join(f(e.get("sm_mhz"), "{:.0f}") for e in ends) if clocks else "—"
    mem = "→".join(f(e.get("mem_mhz"), "{:.0f}") for e in ends) if clocks else "—"
    temp = "→".join(f(e.get("temp_c"), "{:.0f}") for e in ends) if clocks else "—"
    shown = "SM %s MHz, mem %s MHz, %s °C" % (sm, mem, temp) if clocks else "—"
    return "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        j["job"], j["state"], f(j["not_serving_s"]), fate("in_flight_at_drain_start"), fate("in_flight_at_pause"),
        fate("arrived_in_window"),
        f(report.get("prober_outage_s")), "%s → %s" % (j["main_pid_before"], j["main_pid_after"]),
        f(j["lever512"]), shown)


lines += ["", "The clients (load.py report: complete/truncated/failed of n) and the GPU clocks of the timed part "
          "(start→end):", "", "| job | state | not serving s | in flight at the drain's start | in flight at the pause | "
          "arrived in the window | prober outage s | MainPID | lever(512) | clocks |", "|" + "---|" * 10]
lines += [clients_and_clocks(j) for j in jobs]
open(os.path.join(out, "results.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
