"""An engine-like CUDA server for the H200: SGLang 0.5.17's memory routes implemented for real.

Extends ../shared/device/gpu-systemd/gpu_server.py (a CUDA process that takes nearly the whole card at start,
like SGLang's static pool, does real GPU work per probe, is healthy ~3 s after start). Here its memory is laid
out as SGLang lays it out with --enable-memory-saver, through torch_memory_saver (hook_mode "torch"):
  weights   WEIGHTS_GIB of bf16 in region(tag="weights", enable_cpu_backup=--enable-weights-cpu-backup)
  kv_cache  all but LEAVE_MIB of what is left, in region(tag="kv_cache") (the static KV pool)
and the routes that runner's `service.free: sglang` calls (remote_payload/host/engine.py) answer with
SGLang's request bodies and status codes (tests/hosts/engine_standin.py is the CPU stand-in of the same):
  GET  /get_server_info          {"enable_memory_saver", "enable_weights_cpu_backup", "version", ...}
  POST /pause_generation         {"mode": "abort"|"retract"|"in_place"} (400 for another mode)
  POST /continue_generation      {"torch_empty_cache": bool}
  GET|POST /release_memory_occupation, /resume_memory_occupation {"tags": [...] | null} (null: both); 200, null
  GET  /health                   200 once warm (a small GPU op outside the released regions)
  GET  /health_generate          real GPU work on the weights and the KV pool; 503 while paused or released
  GET  /engine_state             paused, released tags, weights intact (checksum), CUDA free/total
A release while generation is not paused aborts the process (SIGABRT), as SGLang's scheduler assertion takes
the whole server down. Released memory goes back to the driver (nvidia-smi shows it); resumed weights come
back from their host copy, the KV pool comes back as fresh memory (as in SGLang, its contents are not kept).
  python3 gpu_engine_server.py --port 30000 --enable-memory-saver --enable-weights-cpu-backup
"""
import argparse
import contextlib
import http.server
import json
import os
import signal
import sys
import threading
import time
from urllib.parse import urlsplit

SGLANG_MODES = ("abort", "retract", "in_place")
TAGS = ("weights", "kv_cache")
CHUNK = 2 ** 29  # one weights tensor: 2**29 bf16 = 1 GiB


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--weights-gib", type=int, default=15)
    p.add_argument("--leave-mib", type=int, default=4096, help="left free after the KV pool is laid out")
    p.add_argument("--enable-memory-saver", action="store_true")
    p.add_argument("--enable-weights-cpu-backup", action="store_true")
    p.add_argument("--warmup-s", type=float, default=3.0)
    return p.parse_args(argv)


class NoSaver:
    """SGLang without --enable-memory-saver: regions are plain allocations, pause/resume do nothing."""

    def region(self, tag, enable_cpu_backup=False):
        return contextlib.nullcontext()

    def pause(self, tag):
        pass

    def resume(self, tag):
        pass


def memory_saver(enabled: bool):
    if not enabled:
        return NoSaver()
    from torch_memory_saver import torch_memory_saver
    torch_memory_saver.hook_mode = "torch"  # in-process allocator, no LD_PRELOAD (measured on the H200)
    return torch_memory_saver


class Engine:
    def __init__(self, args, torch, saver, device="cuda"):
        self.args, self.torch, self.saver, self.device = args, torch, saver, device
        self.lock = threading.Lock()
        self.paused, self.pause_mode, self.released = False, None, set()
        self.generated = 0
        t0 = time.time()
        bf16 = torch.bfloat16
        with saver.region(tag="weights", enable_cpu_backup=args.enable_weights_cpu_backup):
            self.weights = [torch.empty(CHUNK, dtype=bf16, device=device).normal_(0, 0.02)
                            for _ in range(args.weights_gib)]
        self.w = self.weights[0][: 4096 * 4096].view(4096, 4096)
        self.x = torch.randn(64, 4096, device=device, dtype=bf16)  # outside the regions: /health's op
        self.checksum = self.weights_checksum()
        free = self.free_total()[0]
        with saver.region(tag="kv_cache"):
            self.pool = torch.empty(max(2 ** 20, free - args.leave_mib * 2 ** 20), dtype=torch.uint8, device=device)
        self.pool[:: 2 ** 20] = 1  # touched, as a real pool's first use maps it
        self.generate()
        self.sync()
        time.sleep(args.warmup_s)  # warm-up before the first healthy answer, like a real server
        self.startup_s = round(time.time() - t0, 2)

    def free_total(self):
        if self.device == "cuda":
            return self.torch.cuda.mem_get_info()
        return (0, 0)

    def sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def weights_checksum(self):
        return float(sum(float(t[:: 2 ** 16].float().sum().item()) for t in self.weights))

    def generate(self):
        """One "decode step": 32 layers over the weights, then a write into the KV pool (both must be mapped)."""
        y = self.x
        for _ in range(32):
            y = self.torch.tanh(y @ self.w)
        n = self.pool.numel()
        at = (self.generated * 2 ** 26) % max(1, n - 2 ** 26)
        self.pool[at: at + 2 ** 26].add_(1)
        self.generated += 1
        return float(y.float().abs().sum().item())

    def serving(self):
        return not self.paused and not self.released

    # the routes' effects (called under self.lock)
    def release(self, tags):
        if not self.paused:
            print(json.dumps({"event": "abort", "why": "release while generating", "t": time.time()}), flush=True)
            os.abort()  # SGLang's scheduler assertion: the whole server goes down
        self.sync()
        for tag in tags:
            if tag not in self.released:
                t = time.time()
                self.saver.pause(tag)
                self.released.add(tag)
                print(json.dumps({"event": "released", "tag": tag, "s": round(time.time() - t, 3)}), flush=True)

    def resume(self, tags):
        for tag in sorted(tags, key=TAGS.index):  # weights first: the pool is laid out after them
            if tag in self.released:
                t = time.time()
                self.saver.resume(tag)
                self.released.discard(tag)
                print(json.dumps({"event": "resumed", "tag": tag, "s": round(time.time() - t, 3)}), flush=True)
        self.sync()

    def state(self):
        free, total = self.free_total()
        intact = None if "weights" in self.released else self.weights_checksum() == self.checksum
        return {"pid": os.getpid(), "paused": self.paused, "pause_mode": self.pause_mode,
                "released": sorted(self.released), "weights_intact": intact, "generated": self.generated,
                "cuda_free_mib": free // 2 ** 20, "cuda_total_mib": total // 2 ** 20, "startup_s": self.startup_s}


# ── routes: (engine, body) → (status, JSON content or Ellipsis for an empty body) ───────────────────────────

def route_health(engine, body):
    engine.torch.tanh(engine.x).sum().item()
    return 200, Ellipsis


def route_health_generate(engine, body):
    if not engine.serving():
        return 503, Ellipsis
    engine.generate()
    return 200, Ellipsis


def route_server_info(engine, body):
    a = engine.args
    return 200, {"enable_memory_saver": a.enable_memory_saver, "enable_weights_cpu_backup": a.enable_weights_cpu_backup,
                 "version": "0.5.17 (gpu_engine_server)", "internal_states": [], "weights_gib": a.weights_gib,
                 "kv_cache_mib": engine.pool.numel() // 2 ** 20}


def route_pause(engine, body):
    mode = (body or {}).get("mode", "abort")
    if mode not in SGLANG_MODES:
        return 400, {"object": "error", "message": "Invalid mode: %r. Expected one of %s." % (mode, list(SGLANG_MODES)),
                     "type": "Bad Request", "code": 400}
    engine.paused, engine.pause_mode = True, mode
    return 200, {"message": "Generation paused successfully.", "status": "ok"}


def route_continue(engine, body):
    engine.paused, engine.pause_mode = False, None
    if (body or {}).get("torch_empty_cache") and engine.device == "cuda":
        engine.torch.cuda.empty_cache()
    return 200, {"message": "Generation continued successfully.", "status": "ok"}


def tags_of(body):
    tags = (body or {}).get("tags") or list(TAGS)
    unknown = [t for t in tags if t not in TAGS]
    return tags, unknown


def route_release(engine, body):
    tags, unknown = tags_of(body)
    if unknown:
        return 400, {"object": "error", "message": "unknown tags %s" % unknown, "code": 400}
    engine.release(tags)
    return 200, None


def route_resume(engine, body):
    tags, unknown = tags_of(body)
    if unknown:
        return 400, {"object": "error", "message": "unknown tags %s" % unknown, "code": 400}
    engine.resume(tags)
    return 200, None


def route_state(engine, body):
    return 200, engine.state()


ROUTES = {("GET", "/health"): route_health, ("GET", "/health_generate"): route_health_generate,
          ("GET", "/get_server_info"): route_server_info, ("GET", "/server_info"): route_server_info,
          ("POST", "/pause_generation"): route_pause, ("POST", "/continue_generation"): route_continue,
          ("GET", "/engine_state"): route_state}
for _m in ("GET", "POST"):
    ROUTES[(_m, "/release_memory_occupation")] = route_release
    ROUTES[(_m, "/resume_memory_occupation")] = route_resume


def handler(engine):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):
            self.serve("GET")

        def do_POST(self):
            self.serve("POST")

        def serve(self, method):
            path = urlsplit(self.path).path
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            route = ROUTES.get((method, path))
            if route is None:
                return self.answer(404, {"detail": "Not Found"})
            try:
                body = json.loads(raw) if raw.strip() else None
            except ValueError:
                return self.answer(400, {"object": "error", "message": "JSON decode error", "code": 400})
            with engine.lock:
                status, content = route(engine, body)
            if path not in ("/health", "/health_generate", "/engine_state"):
                print(json.dumps({"event": "call", "t": time.time(), "route": "%s %s" % (method, path),
                                  "body": body, "status": status}), flush=True)
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


def main(argv):
    args = parse_args(argv)
    import torch
    engine = Engine(args, torch, memory_saver(args.enable_memory_saver))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), handler(engine))
    srv.daemon_threads = True
    print(json.dumps(dict(engine.state(), event="ready", kv_cache_mib=engine.pool.numel() // 2 ** 20)), flush=True)

    def stop(*_):
        print(json.dumps({"event": "term", "t": time.time()}), flush=True)
        threading.Thread(target=srv.shutdown).start()
    signal.signal(signal.SIGTERM, stop)
    srv.serve_forever()
    print(json.dumps({"event": "exit", "t": time.time()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
