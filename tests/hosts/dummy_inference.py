#!/usr/bin/env python3
"""TEST SERVICE: a stand-in inference server, run as the ExecStart of the systemd test host's unit.

A real long-running HTTP server on 127.0.0.1:PORT. `/health` answers 503 until --ready-delay seconds
after start, then 200. While it runs it "holds" --hold-mib of GPU memory by keeping
`<gpu dir>/apps/<pid>` for the nvidia-smi stand-in. On SIGTERM it keeps the memory --release-delay
seconds more, then removes the file and exits 0, as a real server frees memory on its way out.
--fail-on-start exits 1 at once (a unit that cannot come back). Stdlib only.
"""

import argparse
import http.server
import os
import signal
import sys
import threading
import time
from pathlib import Path


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--hold-mib", type=int, default=0)
    parser.add_argument("--ready-delay", type=float, default=2.0)
    parser.add_argument("--release-delay", type=float, default=0.5)
    parser.add_argument("--fail-on-start", action="store_true")
    parser.add_argument("--gpu-dir", default=os.environ.get("RUNNER_FAKE_GPU_DIR") or "/run/runner-fake-gpu")
    return parser.parse_args(argv)


def health_handler(ready_at: float):
    class HealthHandler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/health":
                self.send_error(404)
                return
            ready = time.monotonic() >= ready_at
            body = b"ok\n" if ready else b"loading\n"
            self.send_response(200 if ready else 503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args):  # health polls would flood the unit's log
            pass

    return HealthHandler


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.fail_on_start:
        print("dummy inference: failing on start as configured", flush=True)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    apps_file = Path(args.gpu_dir) / "apps" / str(os.getpid())
    if args.hold_mib:
        apps_file.write_text(f"{os.getpid()},{args.hold_mib}")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port),
                                             health_handler(time.monotonic() + args.ready_delay))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"dummy inference: pid {os.getpid()} serving on {args.port}, holding {args.hold_mib} MiB", flush=True)
    stop.wait()
    print("dummy inference: SIGTERM, releasing memory", flush=True)
    time.sleep(args.release_delay)
    apps_file.unlink(missing_ok=True)
    server.shutdown()
    print("dummy inference: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
