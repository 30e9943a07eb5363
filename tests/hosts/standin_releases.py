"""TEST STAND-IN part: each engine release's contract, as its published wheel's code has it (read, not copied).

Routes are (method, path) → Route(answer, since, until, auth): a route exists from release `since` up to `until`
(inclusive, None: open-ended); `auth` is SGLang's level (srt/utils/auth.py): "admin" for ADMIN_OPTIONAL (with
--admin-api-key it needs that key as a Bearer token, else with --api-key that one), "normal" (needs --api-key when
set), "open" (/health*, /ready, /metrics always). vLLM's --api-key guards only /v1, /v2, /inference, /cohere: its
dev routes are open to whoever reaches the port.

SGLang (srt/entrypoints/http_server.py, managers/scheduler.py, scheduler_components/weight_updater.py):
- /pause_generation {"mode": abort|retract|in_place}: abort aborts every request (running: truncated), retract puts
  the running ones back in the waiting queue (KV freed, recomputed after /continue_generation), in_place freezes
  them; in every mode arrivals wait in the tokenizer until /continue_generation.
- /release_memory_occupation asserts the scheduler is idle, else the whole server dies (exit 134 here):
  0.5.17-0.5.20 `is_fully_idle()` (running AND waiting empty: a retract pause with requests in flight kills it);
  0.5.21+ `is_fully_idle(ignore_waiting=paused)` (after a retract pause only the running batch must be empty).
  /flush_cache answers 200 by the same rule (waiting up to ?timeout= for a strict idle), else 400.
- /get_load (a shim over the load snapshot) until 0.5.20; /v1/loads in all: per DP rank num_running_reqs,
  num_waiting_reqs, from the snapshot the scheduler's loop publishes, which it does not while paused (stale).
- /server_info (/get_server_info its deprecated alias): version, enable_memory_saver, enable_weights_cpu_backup.
vLLM (entrypoints/serve/sleep|dev/sleep/api_router.py, serve/rlhf|rl/online/api_router.py, v1/engine/core.py):
- dev routes only with VLLM_SERVER_DEV_MODE=1; sleep needs --enable-sleep-mode (else 500).
- /sleep?level=1: before 0.17 aborts what runs; from 0.17 ?mode=abort (the default)|wait|keep: wait lets the
  requests in flight finish first (the call answers once memory is freed). Arrivals while asleep are queued.
- /pause: from 0.12 (not dev-gated until 0.15) with ?wait_for_inflight_requests=, ?mode= from 0.16; arrivals
  during a pause are held until /resume, from 0.33 refused (503 engine_paused) in abort/wait mode.
- /is_sleeping is true while asleep or paused; /version always.
"""

import time


def version_tuple(text):
    parts = []
    for piece in str(text).split("."):
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


class Route:
    def __init__(self, answer, since="0", until=None, auth="normal", unlocked=False):
        self.answer, self.since, self.until, self.auth, self.unlocked = answer, since, until, auth, unlocked

    def exists(self, version):
        return version_tuple(self.since) <= version and (self.until is None or version <= version_tuple(self.until))


def bearer_ok(header, key):
    scheme, _, token = (header or "").partition(" ")
    return scheme.lower() == "bearer" and token == key


def sglang_auth(args, level, header):
    """SGLang's decide_request_auth: None when allowed, else the status it answers."""
    if level == "open":
        return None
    if level == "admin" and args.admin_api_key:
        return None if bearer_ok(header, args.admin_api_key) else 401
    if args.api_key:
        return None if bearer_ok(header, args.api_key) else 401
    return None


# ── SGLang ─────────────────────────────────────────────────────────────────────────────────────────────

def sglang_server_info(engine, body, query):
    return 200, {"enable_memory_saver": engine.args.memory_saver, "version": engine.args.version,
                 "enable_weights_cpu_backup": engine.args.weights_cpu_backup, "internal_states": []}


def ranks(engine):
    """Per DP rank (running, waiting), as the last published snapshot has them."""
    running, waiting = engine.snapshot
    size = engine.args.dp_size
    return [(running // size + (rank < running % size), waiting // size + (rank < waiting % size))
            for rank in range(size)]


def sglang_get_load(engine, body, query):
    engine.start_load()
    return 200, [{"dp_rank": rank, "num_reqs": r + w, "num_waiting_reqs": w, "num_tokens": 0,
                  "num_pending_tokens": 0, "ts_tic": time.perf_counter()} for rank, (r, w) in enumerate(ranks(engine))]


def sglang_v1_loads(engine, body, query):
    engine.start_load()
    return 200, {"timestamp": time.time(), "version": engine.args.version, "num_accelerators": 1,
                 "loads": [{"dp_rank": rank, "num_running_reqs": r, "num_waiting_reqs": w, "num_used_tokens": 0}
                           for rank, (r, w) in enumerate(ranks(engine))]}


SGLANG_MODES = ("abort", "retract", "in_place")


def sglang_pause(engine, body, query):
    mode = (body or {}).get("mode", "abort")
    if mode not in SGLANG_MODES:
        return 400, {"object": "error", "message": "Invalid mode: %r. Expected one of %s." % (mode, list(SGLANG_MODES)),
                     "type": "Bad Request", "code": 400}
    engine.pause(mode)
    return 200, {"message": "Generation paused successfully.", "status": "ok"}


def sglang_continue(engine, body, query):
    engine.resume_generation()
    return 200, {"message": "Generation continued successfully.", "status": "ok"}


def sglang_idle(engine, strict):
    running, waiting = engine.load.counts()
    ignore_waiting = not strict and engine.paused and engine.version >= (0, 5, 21)
    return not running and (ignore_waiting or not waiting)


def sglang_flush_cache(engine, body, query):
    """Unlocked: with ?timeout= it waits for a strict idle (the flush wrapper's); then the flush's own rule."""
    end = time.monotonic() + float((query.get("timeout") or ["0"])[0])
    while True:
        with engine.lock:
            engine.tick()
            if sglang_idle(engine, strict=time.monotonic() < end):
                return 200, "Cache flushed.\n"
        if time.monotonic() >= end:
            return 400, "Cache not flushed. Please check for pending requests."
        time.sleep(0.02)


def tags_of(body):
    return (body or {}).get("tags") or ["weights", "kv_cache"]


def sglang_release(engine, body, query):
    engine.tick()
    if not sglang_idle(engine, strict=False) or not engine.paused:
        engine.die("release_memory_occupation should be called only when server is idle")
    engine.release(tags_of(body))
    return 200, None


def sglang_resume(engine, body, query):
    engine.resume_memory(tags_of(body))
    return 200, None


def sglang_health_generate(engine, body, query):
    serving = engine.ready() and not engine.paused and all(engine.on_gpu.values())
    return (200, Ellipsis) if serving else (503, Ellipsis)


def hicache_backend(engine, body, query):
    if not engine.args.admin_api_key:
        return 400, {"error": "This endpoint requires admin API key, but this server was started without one"}
    return 200, {"hicache_storage_backend": None}


# ── vLLM ───────────────────────────────────────────────────────────────────────────────────────────────

def vllm_version(engine, body, query):
    return 200, {"version": engine.args.version}


def vllm_mode(engine, query, legacy_default="abort"):
    if engine.version >= (0, 16) and query.get("mode"):
        return query["mode"][0]
    wait = (query.get("wait_for_inflight_requests") or ["false"])[0].lower() == "true"
    return "wait" if wait else legacy_default


def vllm_sleep(engine, body, query):
    """Unlocked: mode wait keeps stepping until what runs has finished, then frees the memory."""
    if not engine.args.sleep_mode:
        return 500, {"error": "Sleep mode is not enabled in the model config"}
    mode = query["mode"][0] if engine.version >= (0, 17) and query.get("mode") else "abort"
    level = int((query.get("level") or ["1"])[0])
    with engine.lock:
        engine.quiesce(mode, refuse=False)
    engine.wait_drained()
    with engine.lock:
        engine.sleep(level)
    return 200, ({"status": "sleeping", "level": level} if engine.version >= (0, 34) else Ellipsis)


def vllm_wake(engine, body, query):
    engine.wake(query.get("tags") or ["weights", "kv_cache"])
    return 200, ({"status": "sleeping" if engine.sleeping else "awake"} if engine.version >= (0, 34) else Ellipsis)


def vllm_is_sleeping(engine, body, query):
    return 200, {"is_sleeping": engine.sleeping or engine.paused}


def vllm_pause(engine, body, query):
    """Unlocked: mode wait answers once the requests in flight have finished."""
    mode = vllm_mode(engine, query)
    if mode not in ("abort", "wait", "keep"):
        return 400, {"error": "Invalid pause mode: %s" % mode}
    with engine.lock:
        engine.quiesce(mode, refuse=engine.version >= (0, 33) and mode != "keep")
    engine.wait_drained()
    return 200, {"status": "paused"}


def vllm_resume(engine, body, query):
    engine.resume_generation()
    return 200, {"status": "resumed"}


def vllm_is_paused(engine, body, query):
    return 200, {"is_paused": engine.paused}


def vllm_metrics(engine, body, query):
    running, waiting = engine.load.counts()
    return 200, ('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0",model_name="standin"} '
                 '%.1f\nvllm:num_requests_waiting{engine="0",model_name="standin"} %.1f\n' % (running, waiting))


def vllm_server_info(engine, body, query):
    return 200, {"vllm_config": "model='standin', enable_sleep_mode=%s" % engine.args.sleep_mode}


def health(engine, body, query):
    return (200, Ellipsis) if engine.ready() else (503, Ellipsis)


def standin_state(engine, body, query):
    return 200, engine.state()


SGLANG = {("GET", "/health"): Route(health, auth="open"),
          ("GET", "/health_generate"): Route(sglang_health_generate, auth="open"),
          ("GET", "/ready"): Route(health, since="0.5.20", auth="open"),
          ("GET", "/get_server_info"): Route(sglang_server_info),
          ("GET", "/server_info"): Route(sglang_server_info),
          ("GET", "/get_load"): Route(sglang_get_load, until="0.5.20"),
          ("GET", "/v1/loads"): Route(sglang_v1_loads),
          ("POST", "/pause_generation"): Route(sglang_pause, auth="admin"),
          ("POST", "/continue_generation"): Route(sglang_continue, auth="admin"),
          ("GET", "/hicache/storage-backend"): Route(hicache_backend, auth="admin"),
          ("GET", "/standin_state"): Route(standin_state, auth="open")}
for _method in ("GET", "POST"):
    SGLANG[(_method, "/release_memory_occupation")] = Route(sglang_release, auth="admin")
    SGLANG[(_method, "/resume_memory_occupation")] = Route(sglang_resume, auth="admin")
    SGLANG[(_method, "/flush_cache")] = Route(sglang_flush_cache, auth="admin", unlocked=True)
VLLM = {("GET", "/health"): Route(health, auth="open"), ("GET", "/version"): Route(vllm_version, auth="open"),
        ("GET", "/metrics"): Route(vllm_metrics, auth="open"),
        ("GET", "/standin_state"): Route(standin_state, auth="open")}
VLLM_DEV = {("POST", "/sleep"): Route(vllm_sleep, auth="open", unlocked=True),
            ("POST", "/wake_up"): Route(vllm_wake, auth="open"),
            ("GET", "/is_sleeping"): Route(vllm_is_sleeping, auth="open"),
            ("GET", "/server_info"): Route(vllm_server_info, auth="open"),
            ("POST", "/pause"): Route(vllm_pause, since="0.16", auth="open", unlocked=True),
            ("POST", "/resume"): Route(vllm_resume, since="0.16", auth="open"),
            ("GET", "/is_paused"): Route(vllm_is_paused, since="0.16", auth="open")}
VLLM_OPEN_PAUSE = {("POST", "/pause"): Route(vllm_pause, until="0.15", auth="open", unlocked=True),
                   ("POST", "/resume"): Route(vllm_resume, until="0.15", auth="open"),
                   ("GET", "/is_paused"): Route(vllm_is_paused, until="0.15", auth="open")}


def routes_of(args):
    """The routes this stand-in serves: its engine's, as its release and flags have them."""
    if args.engine == "sglang":
        return dict(SGLANG)
    table = dict(VLLM)
    for key, route in VLLM_OPEN_PAUSE.items():
        if route.exists(version_tuple(args.version)):
            table[key] = route
    if args.dev_mode:
        table.update({key: route for key, route in VLLM_DEV.items() if route.exists(version_tuple(args.version))
                      or key not in VLLM_OPEN_PAUSE})
    return table


def find(table, method, path, version):
    route = table.get((method, path))
    return route if route is not None and route.exists(version) else None
