#!/usr/bin/env python3
"""TEST STAND-IN for an SGLang 0.5.x or vLLM server: not the real engines (these machines have no GPU).

A real HTTP server on 127.0.0.1:PORT with the memory routes of the engine it stands in for, their request
bodies and status codes as the engines' sources have them:
- sglang: GET /get_server_info (enable_memory_saver, enable_weights_cpu_backup, version); POST
  /pause_generation {"mode": abort|retract|in_place} (400 for another mode); POST /continue_generation {};
  GET|POST /release_memory_occupation and /resume_memory_occupation {"tags": [...] | null} (null: all; 200
  with a JSON null body); GET /health; GET /health_generate (503 while paused or released: the real one
  waits 20 s for a token first). Without --memory-saver a release answers 200 and frees nothing, as
  SGLang's no-op memory saver does. A release while generation is not paused ABORTS the process (exit 134),
  as SGLang's scheduler assertion takes the whole server down.
- vllm (the dev-mode routes, only with --dev-mode, else 404): POST /sleep?level=1|2, POST
  /wake_up[?tags=weights&tags=kv_cache], GET /is_sleeping {"is_sleeping": bool}, GET /server_info; without
  --sleep-mode a sleep answers 500; GET /health.
Requests in flight (sglang, --clients N --request-s S [--loop]): N clients each send a request of S s of
scheduler work when the first GET /get_load asks (so a test knows what was in flight when the drain or the
abort looked); with --loop each client sends its next one as soon as one ends (a saturating load);
--slip-in K adds K at the first in_place pause (they passed SGLang's gate just before it closed). Time runs
for them only while the scheduler runs (not in an in_place/retract pause, KV cache on the GPU); an abort-mode
pause aborts them; an arrival while paused is held until /continue_generation. GET /get_load answers their
count (num_reqs), POST /flush_cache[?timeout=T] answers 200 once none runs (within T s), else 400, and a
release with any of them running or waiting aborts the process, as SGLang's idle assertion does.
GPU memory is "held" per tag (weights, kv_cache, plus --context-mib) in `<gpu dir>/apps/<pid>`, which the
nvidia-smi stand-in reads. Every request is appended to --calls (JSON lines) so tests can check the order.
--hang ROUTE makes that route accept and never answer (an API that does not answer). --misbehave ROUTE=KIND
makes that route (any path, known or not) answer badly at the HTTP level (MISBEHAVIOURS: a body cut short, a
trickle, a 1 GiB body, a redirect, too many headers, a bad status line, an endless header line, a reset, a
200 with a body that is not JSON; slow-body answers well, its body a moment after its headers); the
route's own effect is not applied. GET /standin_state tells a test the state. SIGTERM frees the memory and exits 0. Stdlib only.
"""

import argparse
import http.server
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

SGLANG_MODES = ("abort", "retract", "in_place")
ABORT_EXIT = 134  # SIGABRT's shell status: what an assertion that kills the scheduler leaves


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("sglang", "vllm"), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--weights-mib", type=int, default=60000)
    parser.add_argument("--kv-mib", type=int, default=60000)
    parser.add_argument("--context-mib", type=int, default=500)
    parser.add_argument("--memory-saver", action="store_true", help="sglang --enable-memory-saver")
    parser.add_argument("--weights-cpu-backup", action="store_true", help="sglang --enable-weights-cpu-backup")
    parser.add_argument("--dev-mode", action="store_true", help="vllm VLLM_SERVER_DEV_MODE=1")
    parser.add_argument("--sleep-mode", action="store_true", help="vllm --enable-sleep-mode")
    parser.add_argument("--ready-delay", type=float, default=0.5)
    parser.add_argument("--hang", action="append", default=[], help="a route that never answers")
    parser.add_argument("--misbehave", action="append", default=[], metavar="ROUTE=KIND[:ARG]",
                        help="answer ROUTE badly: " + ", ".join(MISBEHAVIOURS) + " (redirect:URL)")
    parser.add_argument("--calls", default=None, help="append each request here (JSON lines)")
    parser.add_argument("--clients", type=int, default=0, help="requests in flight once /get_load is first asked")
    parser.add_argument("--request-s", type=float, default=2.0, help="scheduler seconds one request takes")
    parser.add_argument("--loop", action="store_true", help="each client sends its next request at once")
    parser.add_argument("--slip-in", type=int, default=0,
                        help="requests that reach the scheduler just as the first in_place pause does")
    parser.add_argument("--gpu-dir", default=os.environ.get("RUNNER_FAKE_GPU_DIR") or "/run/runner-fake-gpu")
    return parser.parse_args(argv)


class Load:
    """The clients' requests: seconds of scheduler work left for each running one, arrivals held while paused,
    and what became of them. Advanced lazily, on each request to the stand-in."""

    def __init__(self, clients: int, request_s: float, loop: bool):
        self.clients, self.request_s, self.loop = clients, request_s, loop
        self.started, self.last = False, time.monotonic()
        self.running, self.held = [], 0
        self.completed, self.aborted = 0, 0

    def start(self):
        if not self.started:
            self.started, self.last = True, time.monotonic()
            self.running = [self.request_s] * self.clients

    def advance(self, runs: bool, admits: bool):
        now = time.monotonic()
        spent, self.last = now - self.last, now
        while runs and spent > 0 and self.running:
            step = min(spent, min(self.running))
            self.running = [left - step for left in self.running]
            spent -= step
            done = [left for left in self.running if left <= 1e-9]
            self.running = [left for left in self.running if left > 1e-9]
            self.completed += len(done)
            for _ in done if self.loop else []:
                self.arrive(admits)

    def arrive(self, admits: bool):
        if admits:
            self.running.append(self.request_s)
        else:
            self.held += 1

    def abort_all(self):
        self.aborted += len(self.running)
        self.running = []

    def admit_held(self):
        self.running += [self.request_s] * self.held
        self.held = 0

    def state(self):
        return {"running": len(self.running), "held": self.held, "completed": self.completed,
                "aborted": self.aborted}


class Engine:
    """The stand-in's state: which tags are on the "GPU", paused or asleep, the weights' contents."""

    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.ready_at = time.monotonic() + args.ready_delay
        self.paused = False
        self.pause_mode = None
        self.sleeping = False
        self.on_gpu = {"weights": True, "kv_cache": True}
        self.weights_intact = True
        self.load = Load(args.clients, args.request_s, args.loop)
        self.apps_file = Path(args.gpu_dir) / "apps" / str(os.getpid())
        self.write_memory()

    def held_mib(self):
        sizes = {"weights": self.args.weights_mib, "kv_cache": self.args.kv_mib}
        return self.args.context_mib + sum(sizes[tag] for tag, on in self.on_gpu.items() if on)

    def write_memory(self):
        tmp = self.apps_file.with_name(self.apps_file.name + ".tmp")
        tmp.write_text("%d,%d" % (os.getpid(), self.held_mib()))
        os.replace(tmp, self.apps_file)

    def free_all(self):
        self.apps_file.unlink(missing_ok=True)

    def state(self):
        self.tick()
        return {"pid": os.getpid(), "paused": self.paused, "pause_mode": self.pause_mode, "sleeping": self.sleeping,
                "on_gpu": dict(self.on_gpu), "held_mib": self.held_mib(), "weights_intact": self.weights_intact,
                "load": self.load.state()}

    def tick(self):
        """Bring the clients' requests up to now: they run unless the scheduler is frozen or its cache is gone."""
        frozen = self.paused and self.pause_mode in ("in_place", "retract")
        self.load.advance(runs=not frozen and self.on_gpu["kv_cache"], admits=not self.paused)

    def ready(self):
        return time.monotonic() >= self.ready_at

    # sglang
    def release(self, tags):
        self.tick()
        if not self.paused or self.load.running:
            print("engine stand-in: release while generating: aborting like SGLang's scheduler", flush=True)
            self.free_all()
            os._exit(ABORT_EXIT)
        if not self.args.memory_saver:
            return  # the real no-op memory saver: 200, nothing freed
        for tag in tags:
            self.on_gpu[tag] = False
            if tag == "weights" and not self.args.weights_cpu_backup:
                self.weights_intact = False  # no host copy: they come back as uninitialised memory
        self.write_memory()

    def resume(self, tags):
        for tag in tags:
            self.on_gpu[tag] = True
        self.write_memory()

    # vllm
    def sleep(self, level):
        self.on_gpu = {"weights": False, "kv_cache": False}
        if level == 2:
            self.weights_intact = False  # level 2 discards the weights too
        self.sleeping = True
        self.write_memory()

    def wake(self, tags):
        for tag in tags:
            self.on_gpu[tag] = True
        self.sleeping = not all(self.on_gpu.values())
        self.write_memory()


def handler(engine: Engine):
    args = engine.args

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *log_args):
            pass

        def do_GET(self):
            self.serve("GET")

        def do_POST(self):
            self.serve("POST")

        def serve(self, method):
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if args.calls:
                with open(args.calls, "a") as log:
                    log.write(json.dumps({"t": time.time(), "method": method, "path": url.path,
                                          "query": url.query, "body": raw.decode("utf-8", "replace")}) + "\n")
            if url.path in args.hang:
                time.sleep(3600)
                return
            kind = misbehaviour_of(args.misbehave, url.path)
            if kind:
                misbehave(self, *kind)
                self.close_connection = True
                return
            route = (SGLANG if args.engine == "sglang" else VLLM).get((method, url.path))
            if route is None:
                self.answer(404, {"detail": "Not Found"})
                return
            try:
                body = json.loads(raw) if raw.strip() else None
            except ValueError:
                self.answer(400, {"object": "error", "message": "JSON decode error", "code": 400})
                return
            if route in UNLOCKED:
                status, content = route(engine, body, parse_qs(url.query))
            else:
                with engine.lock:
                    status, content = route(engine, body, parse_qs(url.query))
            self.answer(status, content)

        def answer(self, status, content):
            data = b"" if content is Ellipsis else (content.encode() if isinstance(content, str)
                                                    else json.dumps(content).encode())
            self.send_response(status)
            if data:
                self.send_header("Content-Type", "text/plain" if isinstance(content, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


# ── answers that break HTTP: what a broken or hostile engine (or whatever holds its port) may send ──────────

CUT_LENGTH = 1000
HUGE_BYTES = 1 << 30
HEADER_FLOOD = 150   # http.client refuses more than 100
LONG_LINE = 70000    # http.client refuses a line over 65536


def misbehaviour_of(rules, path):
    """(kind, arg) for path from --misbehave ROUTE=KIND[:ARG] rules, or None."""
    for rule in rules:
        route, _, kind = rule.partition("=")
        if route == path:
            name, _, arg = kind.partition(":")
            return name, arg
    return None


def misbehave(request, kind, arg):
    out = request.wfile
    try:
        MISBEHAVIOURS[kind](request, out, arg)
        out.flush()
    except OSError:
        pass  # the client gave up: that is what a bounded client does


def cut_short(request, out, arg):
    # 6 bytes that parse as SGLang's own answer to a release (JSON null), then the connection closes
    out.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\nnull  " % CUT_LENGTH)


def trickle(request, out, arg):
    out.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % CUT_LENGTH)
    for _ in range(CUT_LENGTH):
        out.write(b" ")
        out.flush()
        time.sleep(1.0)


def slow_body(request, out, arg):
    # a good answer whose body comes a moment after its headers, the connection then closed: within any deadline
    out.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
              b"Content-Length: 12\r\n\r\n")
    out.flush()
    time.sleep(0.3)
    out.write(b'{"ok": true}')


def huge(request, out, arg):
    out.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % HUGE_BYTES)
    block = b" " * (1 << 16)
    for _ in range(HUGE_BYTES // len(block)):
        out.write(block)


def redirect(request, out, arg):
    out.write(b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % arg.encode())


def header_flood(request, out, arg):
    out.write(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-Standin-%d: x\r\n" % n for n in range(HEADER_FLOOD))
              + b"Content-Length: 2\r\n\r\n{}")


def bad_status_line(request, out, arg):
    out.write(b"SGLANG IS FINE\r\nContent-Length: 2\r\n\r\n{}")


def long_header_line(request, out, arg):
    out.write(b"HTTP/1.1 200 OK\r\nX-Standin: " + b"x" * LONG_LINE + b"\r\nContent-Length: 2\r\n\r\n{}")


def reset(request, out, arg):
    # SO_LINGER 0: close() sends RST instead of FIN
    request.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    request.connection.close()


def not_json(request, out, arg):
    out.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n{not json")


MISBEHAVIOURS = {"cut-short": cut_short, "trickle": trickle, "slow-body": slow_body, "huge": huge, "redirect": redirect,
                 "header-flood": header_flood, "bad-status-line": bad_status_line,
                 "long-header-line": long_header_line, "reset": reset, "not-json": not_json}


# ── the routes: (engine, JSON body, query) → (status, JSON content, or Ellipsis for an empty body) ────────

def health(engine, body, query):
    return (200, Ellipsis) if engine.ready() else (503, Ellipsis)


def sglang_health_generate(engine, body, query):
    serving = engine.ready() and not engine.paused and all(engine.on_gpu.values())
    return (200, Ellipsis) if serving else (503, Ellipsis)


def sglang_server_info(engine, body, query):
    return 200, {"enable_memory_saver": engine.args.memory_saver, "version": "0.5.x-standin",
                 "enable_weights_cpu_backup": engine.args.weights_cpu_backup, "internal_states": []}


def sglang_pause(engine, body, query):
    mode = (body or {}).get("mode", "abort")
    if mode not in SGLANG_MODES:
        return 400, {"object": "error", "message": "Invalid mode: %r. Expected one of %s." % (mode, list(SGLANG_MODES)),
                     "type": "Bad Request", "code": 400}
    engine.tick()
    engine.paused, engine.pause_mode = True, mode
    if mode == "abort":
        engine.load.abort_all()
    if mode == "in_place" and engine.args.slip_in:  # passed the gate before it closed: in the scheduler now
        engine.load.running += [engine.load.request_s] * engine.args.slip_in
        engine.args.slip_in = 0
    return 200, {"message": "Generation paused successfully.", "status": "ok"}


def sglang_continue(engine, body, query):
    engine.tick()
    engine.paused, engine.pause_mode = False, None
    engine.load.admit_held()
    return 200, {"message": "Generation continued successfully.", "status": "ok"}


def sglang_get_load(engine, body, query):
    engine.load.start()
    engine.tick()
    return 200, [{"dp_rank": 0, "num_reqs": len(engine.load.running), "num_waiting_reqs": 0, "num_tokens": 0,
                  "num_pending_tokens": 0, "ts_tic": time.perf_counter()}]


def sglang_flush_cache(engine, body, query):
    """Called without the engine's lock: it waits (up to ?timeout=) for the scheduler to be idle."""
    end = time.monotonic() + float((query.get("timeout") or ["0"])[0])
    while True:
        with engine.lock:
            engine.tick()
            if not engine.load.running:
                return 200, "Cache flushed."
        if time.monotonic() >= end:
            return 400, "Cache not flushed. Please check for pending requests."
        time.sleep(0.02)


def tags_of(body):
    tags = (body or {}).get("tags")
    return tags or ["weights", "kv_cache"]


def sglang_release(engine, body, query):
    engine.release(tags_of(body))
    return 200, None


def sglang_resume(engine, body, query):
    engine.resume(tags_of(body))
    return 200, None


def vllm_sleep(engine, body, query):
    if not engine.args.sleep_mode:
        return 500, {"error": "Sleep mode is not enabled in the model config"}
    engine.sleep(int((query.get("level") or ["1"])[0]))
    return 200, Ellipsis


def vllm_wake(engine, body, query):
    engine.wake(query.get("tags") or ["weights", "kv_cache"])
    return 200, Ellipsis


def vllm_is_sleeping(engine, body, query):
    return 200, {"is_sleeping": engine.sleeping}


def vllm_server_info(engine, body, query):
    return 200, {"vllm_config": "model='standin', enable_sleep_mode=%s" % engine.args.sleep_mode}


def standin_state(engine, body, query):
    return 200, engine.state()


SGLANG = {("GET", "/health"): health, ("GET", "/health_generate"): sglang_health_generate,
          ("GET", "/get_server_info"): sglang_server_info, ("POST", "/pause_generation"): sglang_pause,
          ("POST", "/continue_generation"): sglang_continue, ("GET", "/standin_state"): standin_state,
          ("GET", "/get_load"): sglang_get_load}
UNLOCKED = {sglang_flush_cache}
for _method in ("GET", "POST"):
    SGLANG[(_method, "/release_memory_occupation")] = sglang_release
    SGLANG[(_method, "/resume_memory_occupation")] = sglang_resume
    SGLANG[(_method, "/flush_cache")] = sglang_flush_cache
VLLM = {("GET", "/health"): health, ("GET", "/standin_state"): standin_state}


def main(argv):
    args = parse_args(argv)
    if args.dev_mode:
        VLLM.update({("POST", "/sleep"): vllm_sleep, ("POST", "/wake_up"): vllm_wake,
                     ("GET", "/is_sleeping"): vllm_is_sleeping, ("GET", "/server_info"): vllm_server_info})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    engine = Engine(args)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), handler(engine))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print("engine stand-in (%s): pid %d on %d, holding %d MiB" % (args.engine, os.getpid(), args.port,
                                                                 engine.held_mib()), flush=True)
    stop.wait()
    engine.free_all()
    print("engine stand-in: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
