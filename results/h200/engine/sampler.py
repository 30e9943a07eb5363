"""Samples, as JSON lines to OUT, until SIGTERM: every 0.2 s GET /health_generate (status, latency), every 0.25 s
nvidia-smi's memory.used/free of GPU 0 (its own -lms loop), every 0.5 s the unit's MainPID and ActiveState.
  python3 sampler.py OUT URL UNIT"""
import json, signal, subprocess, sys, threading, time, urllib.request, urllib.error

out_path, url, unit = sys.argv[1:4]
out, lock, stop = open(out_path, "a"), threading.Lock(), threading.Event()


def emit(**row):
    with lock:
        out.write(json.dumps(row) + "\n")
        out.flush()


def health():
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while not stop.is_set():
        t = time.time()
        try:
            with opener.open(url, timeout=5) as r:
                code = r.status
        except urllib.error.HTTPError as e:
            code = e.code
        except Exception:
            code = 0  # refused / no answer: not serving
        emit(k="hg", t=round(t, 3), code=code, s=round(time.time() - t, 4))
        stop.wait(0.2)


def memory():
    p = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used,memory.free", "--format=csv,noheader,nounits",
                          "-i", "0", "-lms", "250"], stdout=subprocess.PIPE, text=True)
    for line in p.stdout:
        if stop.is_set():
            break
        used, free = [int(v) for v in line.split(",")]
        emit(k="mem", t=round(time.time(), 3), used=used, free=free)
    p.terminate()


def unit_state():
    while not stop.is_set():
        r = subprocess.run(["systemctl", "show", "-p", "MainPID", "-p", "ActiveState", unit],
                           capture_output=True, text=True)
        kv = dict(line.split("=", 1) for line in r.stdout.split() if "=" in line)
        emit(k="pid", t=round(time.time(), 3), pid=int(kv.get("MainPID") or 0), state=kv.get("ActiveState"))
        stop.wait(0.5)


signal.signal(signal.SIGTERM, lambda *_: stop.set())
threads = [threading.Thread(target=f, daemon=True) for f in (health, memory, unit_state)]
for th in threads:
    th.start()
while not stop.is_set():
    time.sleep(0.5)
time.sleep(0.3)
