"""Client load on an SGLang server, and what it saw during runner's windows (stdlib only).

    python3 load.py run LOG URL [CLIENTS] [TOKENS] [THINK_S]    until SIGTERM: CLIENTS (4) clients each looping
        POST /generate of TOKENS (1500) new tokens (input_ids, ignore_eos: every complete answer has exactly TOKENS)
        with THINK_S (0: none, a saturating load) between an answer and the next request, and a prober
        sending a 1-token /generate every 0.25 s (each in its own thread, so a held probe does not stop the next);
        one JSON line per request: kind (load|probe), client, start, end, http, finish (SGLang's finish_reason type),
        tokens (meta_info.completion_tokens), error
    python3 load.py report LOG STATUS.json...          per job (the host's status.json): the window from its
        stopped_at (the pause that held) to restored_at, the load requests in flight at its start and those that
        arrived in it, each by outcome (complete = HTTP 200 with TOKENS tokens; truncated = 200 with fewer;
        failed = any other answer), and the prober's outage (first probe held > 1 s or not answered 200, to the last such one's answer);
        then one line over the whole log: every load request that did not complete, and the probes not answered 200
"""
import json
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

PROMPT = list(range(1, 33))  # 32 input ids: the server runs with --skip-tokenizer-init
PROBE_EVERY_S = 0.25
HELD_S = 1.0  # a probe slower than this was held (SGLang answers a 1-token probe in milliseconds)


def post(url: str, body: dict, timeout: float) -> dict:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    row = {"start": round(time.time(), 4)}
    try:
        with opener.open(request, timeout=timeout) as answer:
            code, text = answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        code, text = exc.code, exc.read()
    except Exception as exc:  # refused, reset, timed out: no answer
        code, text = 0, b""
        row["error"] = "%s: %s" % (type(exc).__name__, exc)
    row.update(end=round(time.time(), 4), http=code)
    try:
        meta = json.loads(text).get("meta_info") or {}
        row.update(finish=(meta.get("finish_reason") or {}).get("type"), tokens=meta.get("completion_tokens"))
    except (ValueError, AttributeError):
        if code != 200 and text:
            row["error"] = text.decode("utf-8", "replace")[:200]
    return row


def run(log_path: str, base: str, clients: int, tokens: int, think_s: float) -> None:
    out, lock, stop = open(log_path, "a"), threading.Lock(), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def emit(row: dict) -> None:
        with lock:
            out.write(json.dumps(row) + "\n")
            out.flush()

    def client(n: int) -> None:
        body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True,
                                                          "temperature": 0.0}}
        while not stop.is_set():
            row = post(base + "/generate", body, 600)
            emit(dict(row, kind="load", client=n))
            if row["http"] != 200 or think_s:
                stop.wait(max(think_s, 0.1))  # the client's think time; a refusing server: do not spin

    def probe() -> None:
        body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
        emit(dict(post(base + "/generate", body, 600), kind="probe"))

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    for thread in threads:
        thread.start()
    while not stop.wait(PROBE_EVERY_S):
        threading.Thread(target=probe, daemon=True).start()
    time.sleep(0.5)  # let the last probes land; the clients' open requests are cut by the exit


def outcome(row: dict, tokens: int) -> str:
    if row["http"] != 200:
        return "failed"
    return "complete" if row.get("tokens") == tokens and row.get("finish") == "length" else "truncated"


def window_report(rows: list, status: dict, tokens: int) -> dict:
    service = status.get("service") or {}
    begin, end = service.get("stopped_at"), service.get("restored_at")
    report = {"job": status.get("job_id"), "state": status.get("state"), "window": [begin, end]}
    if begin is None or end is None:
        return report
    load = [r for r in rows if r["kind"] == "load"]
    in_flight = [r for r in load if r["start"] < begin < r["end"]]
    arrived = [r for r in load if begin <= r["start"] < end]
    released = service.get("released") or {}
    drain_began = released.get("released_at")
    at_drain = [r for r in load if drain_began and r["start"] < drain_began < r["end"]]

    def by_outcome(group: list) -> dict:
        counts = {"complete": 0, "truncated": 0, "failed": 0}
        for row in group:
            counts[outcome(row, tokens)] += 1
        return dict(counts, n=len(group), tokens=sorted(r.get("tokens") or 0 for r in group
                                                        if outcome(r, tokens) != "complete"),
                    http=sorted(set(r["http"] for r in group)))
    held = [r for r in rows if r["kind"] == "probe" and (r["end"] - r["start"] > HELD_S or r["http"] != 200)
            and r["end"] >= begin - 1 and r["start"] <= end + 1]  # held, or refused (`free: stop`)
    report.update(in_flight_at_pause=by_outcome(in_flight), arrived_in_window=by_outcome(arrived),
                  in_flight_at_drain_start=by_outcome(at_drain),
                  prober_outage_s=round(max(r["end"] for r in held) - min(r["start"] for r in held), 2)
                  if held else 0.0,
                  probes_failed=sum(1 for r in rows if r["kind"] == "probe" and r["http"] != 200
                                    and begin - 1 <= r["start"] <= end + 1))
    return report


def main(argv: list) -> int:
    if argv[:1] == ["run"]:
        run(argv[1], argv[2].rstrip("/"), int(argv[3]) if len(argv) > 3 else 4,
            int(argv[4]) if len(argv) > 4 else 1500, float(argv[5]) if len(argv) > 5 else 0.0)
        return 0
    if argv[:1] == ["report"]:
        rows = [json.loads(line) for line in open(argv[1]) if line.strip()]
        for path in argv[2:]:
            print(json.dumps(window_report(rows, json.load(open(path)), 1500)))
        load = [r for r in rows if r["kind"] == "load"]
        print(json.dumps({"all_load_requests": len(load),
                          "not_complete": [r for r in load if outcome(r, 1500) != "complete"],
                          "probes": sum(1 for r in rows if r["kind"] == "probe"),
                          "probes_not_200": sum(1 for r in rows if r["kind"] == "probe" and r["http"] != 200)}))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
