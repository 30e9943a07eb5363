#!/usr/bin/env python3
"""TEST STAND-IN for an SGLang or vLLM server of a given release: not the real engines (these machines have no GPU).

A real HTTP server on 127.0.0.1:PORT with the routes, request bodies, status codes, pause modes and idle rule of the
release named by --version (tests/hosts/standin_releases.py has each release's contract, read from its wheel) and
its clients' requests (tests/hosts/standin_load.py: what each client saw). --engine sglang: --memory-saver
(--enable-memory-saver; without it a release answers 200 and frees nothing, as SGLang's no-op memory saver does),
--weights-cpu-backup, --api-key / --admin-api-key (its admin routes then need a Bearer token), --dp-size. --engine
vllm: --dev-mode (VLLM_SERVER_DEV_MODE=1, else its dev routes answer 404), --sleep-mode (--enable-sleep-mode).
A release that SGLang's idle rule forbids ABORTS the process (exit 134), as its scheduler assertion takes the whole
server down. Clients (--clients N --request-s S [--loop]): N requests of S s of scheduler work each, started by the
first load read (/get_load, /v1/loads) or --start-load; with --loop each client sends its next request as soon as one
ends (a saturating load); --slip-in K adds K at the first in_place pause (they passed SGLang's gate just before).
GPU memory is "held" per tag (weights, kv_cache, plus --context-mib) in `<gpu dir>/apps/<pid>`, which the
nvidia-smi stand-in reads. Every request is appended to --calls (JSON lines, with its Authorization header's
scheme only) so tests can check the order. --hang ROUTE makes that route accept and never answer. --misbehave
ROUTE=KIND makes that route (any path, known or not) answer badly at the HTTP level (MISBEHAVIOURS: a body cut
short, a trickle, a 1 GiB body, a redirect, too many headers, a bad status line, an endless header line, a reset, a
200 with a body that is not JSON; slow-body answers well, its body a moment after its headers); the route's own
effect is not applied. GET /standin_state tells a test the state. SIGTERM frees the memory and exits 0. Stdlib only.
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

from standin_load import Load
from standin_releases import find, routes_of, sglang_auth, version_tuple

ABORT_EXIT = 134  # SIGABRT's shell status: what an assertion that kills the scheduler leaves
DEFAULT_VERSION = {"sglang": "0.5.17", "vllm": "0.17.0"}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--engine", choices=("sglang", "vllm"), required=True)
    parser.add_argument("--version", default=None, help="the release it stands in for (default: %s)" % DEFAULT_VERSION)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--weights-mib", type=int, default=60000)
    parser.add_argument("--kv-mib", type=int, default=60000)
    parser.add_argument("--context-mib", type=int, default=500)
    parser.add_argument("--memory-saver", action="store_true", help="sglang --enable-memory-saver")
    parser.add_argument("--weights-cpu-backup", action="store_true", help="sglang --enable-weights-cpu-backup")
    parser.add_argument("--api-key", default=None, help="sglang --api-key")
    parser.add_argument("--admin-api-key", default=None, help="sglang --admin-api-key")
    parser.add_argument("--dp-size", type=int, default=1, help="sglang data-parallel ranks")
    parser.add_argument("--dev-mode", action="store_true", help="vllm VLLM_SERVER_DEV_MODE=1")
    parser.add_argument("--sleep-mode", action="store_true", help="vllm --enable-sleep-mode")
    parser.add_argument("--ready-delay", type=float, default=0.5)
    parser.add_argument("--hang", action="append", default=[], help="a route that never answers")
    parser.add_argument("--misbehave", action="append", default=[], metavar="ROUTE=KIND[:ARG]",
                        help="answer ROUTE badly: " + ", ".join(MISBEHAVIOURS) + " (redirect:URL)")
    parser.add_argument("--calls", default=None, help="append each request here (JSON lines)")
    parser.add_argument("--clients", type=int, default=0, help="requests in flight once the load starts")
    parser.add_argument("--request-s", type=float, default=2.0, help="scheduler seconds one request takes")
    parser.add_argument("--loop", action="store_true", help="each client sends its next request at once")
    parser.add_argument("--start-load", action="store_true", help="the clients start with the server")
    parser.add_argument("--slip-in", type=int, default=0,
                        help="requests that reach the scheduler just as the first in_place pause does")
    parser.add_argument("--gpu-dir", default=os.environ.get("RUNNER_FAKE_GPU_DIR") or "/run/runner-fake-gpu")
    args = parser.parse_args(argv)
    args.version = args.version or DEFAULT_VERSION[args.engine]
    return args


class Engine:
    """The stand-in's state: what is on the "GPU", whether the engine admits, runs or sleeps, its clients' requests.
    paused: arrivals are kept out (held, or refused when `refusing`); frozen: what runs does not progress."""

    def __init__(self, args):
        self.args, self.version = args, version_tuple(args.version)
        self.lock = threading.Lock()
        self.ready_at = time.monotonic() + args.ready_delay
        self.paused, self.pause_mode, self.frozen, self.refusing, self.sleeping = False, None, False, False, False
        self.on_gpu = {"weights": True, "kv_cache": True}
        self.weights_intact = True
        self.load = Load(args.clients, args.request_s, args.loop)
        self.snapshot = (0, 0)
        self.apps_file = Path(args.gpu_dir) / "apps" / str(os.getpid())
        self.write_memory()
        if args.start_load:
            self.start_load()

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
        return {"pid": os.getpid(), "version": self.args.version, "paused": self.paused, "pause_mode": self.pause_mode,
                "sleeping": self.sleeping, "on_gpu": dict(self.on_gpu), "held_mib": self.held_mib(),
                "weights_intact": self.weights_intact, "load": self.load.state()}

    def tick(self):
        """Bring the clients' requests up to now; the scheduler publishes its load snapshot while not paused."""
        runs = not self.frozen and not self.sleeping and self.on_gpu["kv_cache"]
        self.load.advance(runs=runs, admits=not self.paused)
        if not (self.args.engine == "sglang" and self.paused):
            self.snapshot = self.load.counts()

    def start_load(self):
        with_load = not self.load.started
        self.load.start()
        if with_load:
            self.tick()

    def ready(self):
        return time.monotonic() >= self.ready_at

    def die(self, why):
        print("engine stand-in: %s: aborting like the engine's scheduler" % why, flush=True)
        self.free_all()
        os._exit(ABORT_EXIT)

    # sglang
    def pause(self, mode):
        self.tick()
        now = time.monotonic()
        self.paused, self.pause_mode, self.frozen = True, mode, mode == "in_place"
        if mode == "abort":
            self.load.abort_all(now)
        elif mode == "retract":
            self.load.retract(now)
        else:
            self.load.hold_running(now)
        if mode == "in_place" and self.args.slip_in:  # passed the gate before it closed: in the scheduler now
            self.load.start()
            for _ in range(self.args.slip_in):
                self.load.arrive(True, now)
            self.load.hold_running(now)
            self.args.slip_in = 0

    def resume_generation(self):
        self.tick()
        self.paused, self.pause_mode, self.frozen, self.refusing = False, None, False, False
        self.load.release_frozen(time.monotonic())
        self.tick()

    def release(self, tags):
        self.load.hold_running(time.monotonic())
        if not self.args.memory_saver:
            return  # the real no-op memory saver: 200, nothing freed
        for tag in tags:
            self.on_gpu[tag] = False
            if tag == "weights" and not self.args.weights_cpu_backup:
                self.weights_intact = False  # no host copy: they come back as uninitialised memory
        self.write_memory()

    def resume_memory(self, tags):
        self.tick()
        for tag in tags:
            self.on_gpu[tag] = True
        self.write_memory()

    # vllm
    def quiesce(self, mode, refuse):
        """Close the door (arrivals held, or refused); abort: what runs is aborted; keep: frozen; wait: it runs on."""
        self.tick()
        now = time.monotonic()
        self.paused, self.pause_mode, self.refusing, self.frozen = True, mode, refuse, mode == "keep"
        if mode == "abort":
            self.load.abort_all(now)
        elif mode == "keep":
            self.load.hold_running(now)

    def wait_drained(self):
        while True:
            with self.lock:
                self.tick()
                if not self.load.running or self.frozen:
                    return
            time.sleep(0.02)

    def sleep(self, level):
        self.tick()
        self.load.hold_running(time.monotonic())
        self.on_gpu = {"weights": False, "kv_cache": False}
        if level == 2:
            self.weights_intact = False  # level 2 discards the weights too
        self.sleeping = True
        self.write_memory()

    def wake(self, tags):
        self.tick()
        for tag in tags:
            self.on_gpu[tag] = True
        self.sleeping = not all(self.on_gpu.values())
        self.write_memory()
        if not self.sleeping:
            self.resume_generation()


def handler(engine: Engine):
    args = engine.args
    table = routes_of(args)

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
            authorization = self.headers.get("Authorization")
            if args.calls:
                with open(args.calls, "a") as log:
                    log.write(json.dumps({"t": time.time(), "method": method, "path": url.path, "query": url.query,
                                          "body": raw.decode("utf-8", "replace"),
                                          "auth": (authorization or "").split(" ", 1)[0]}) + "\n")
            if url.path in args.hang:
                time.sleep(3600)
                return
            kind = misbehaviour_of(args.misbehave, url.path)
            if kind:
                misbehave(self, *kind)
                self.close_connection = True
                return
            route = find(table, method, url.path, engine.version)
            refused = sglang_auth(args, route.auth if route else "normal", authorization) \
                if args.engine == "sglang" else None
            if refused:
                self.answer(refused, {"error": "Unauthorized"})
                return
            if route is None:
                self.answer(404, {"detail": "Not Found"})
                return
            try:
                body = json.loads(raw) if raw.strip() else None
            except ValueError:
                self.answer(400, {"object": "error", "message": "JSON decode error", "code": 400})
                return
            if route.unlocked:
                status, content = route.answer(engine, body, parse_qs(url.query))
            else:
                with engine.lock:
                    engine.tick()
                    status, content = route.answer(engine, body, parse_qs(url.query))
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


def main(argv):
    args = parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    engine = Engine(args)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), handler(engine))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print("engine stand-in (%s %s): pid %d on %d, holding %d MiB" % (args.engine, args.version, os.getpid(), args.port,
                                                                    engine.held_mib()), flush=True)
    stop.wait()
    engine.free_all()
    print("engine stand-in: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
