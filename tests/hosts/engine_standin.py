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
GPU memory is "held" per tag (weights, kv_cache, plus --context-mib) in `<gpu dir>/apps/<pid>`, which the
nvidia-smi stand-in reads. Every request is appended to --calls (JSON lines) so tests can check the order.
--hang ROUTE makes that route accept and never answer (an API that does not answer). --misbehave ROUTE=KIND
makes that route (any path, known or not) answer badly at the HTTP level (MISBEHAVIOURS: a body cut short, a
trickle, a 1 GiB body, a redirect, too many headers, a bad status line, an endless header line, a reset, a
200 with a body that is not JSON); the route's own effect is not applied. GET /standin_state tells a test
the state. SIGTERM frees the memory and exits 0. Stdlib only.
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
    parser.add_argument("--gpu-dir", default=os.environ.get("RUNNER_FAKE_GPU_DIR") or "/run/runner-fake-gpu")
    return parser.parse_args(argv)


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
        return {"pid": os.getpid(), "paused": self.paused, "pause_mode": self.pause_mode, "sleeping": self.sleeping,
                "on_gpu": dict(self.on_gpu), "held_mib": self.held_mib(), "weights_intact": self.weights_intact}

    def ready(self):
        return time.monotonic() >= self.ready_at

    # sglang
    def release(self, tags):
        if not self.paused:
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
            with engine.lock:
                status, content = route(engine, body, parse_qs(url.query))
            self.answer(status, content)

        def answer(self, status, content):
            data = b"" if content is Ellipsis else json.dumps(content).encode()
            self.send_response(status)
            if data:
                self.send_header("Content-Type", "application/json")
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


MISBEHAVIOURS = {"cut-short": cut_short, "trickle": trickle, "huge": huge, "redirect": redirect,
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
    engine.paused, engine.pause_mode = True, mode
    return 200, {"message": "Generation paused successfully.", "status": "ok"}


def sglang_continue(engine, body, query):
    engine.paused, engine.pause_mode = False, None
    return 200, {"message": "Generation continued successfully.", "status": "ok"}


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
          ("POST", "/continue_generation"): sglang_continue, ("GET", "/standin_state"): standin_state}
for _method in ("GET", "POST"):
    SGLANG[(_method, "/release_memory_occupation")] = sglang_release
    SGLANG[(_method, "/resume_memory_occupation")] = sglang_resume
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
