"""The Marlin int4 MoE throughput lever: per-token cost at batch size 1 ÷ at batch size M, on sglang's kernel.

    python bench_marlin_moe.py --experts 384 --hidden 7168 --intermediate 2048 --topk 8 --group-size 32 \
        --batch-sizes 1,2,4,8,16,32,64,128,256,512 --backend auto --out result.json

stdout: one JSON event line per event (phase start/end, heartbeats during long phases, one line per timed
window, one row per batch size). result.json: environment, backend used and why (every backend auto tried,
the stage it failed at and the reason), JIT cold/warm, memory, the window order, rows with per-window GPU
clock/power/cap flags, levers with per-repetition min/max and a bootstrap interval, args, and gpu_clocks: the
GPU's SM/memory clocks, temperature and power limit at the start and end of the timed part (nvidia-smi; null
without it).
Timed windows (one batch size, one repetition) run light and heavy in turn, the same order every repetition,
each after 200 ms of its own call untimed (--order interleave --settle busy: results/README.md, run4).
--check: small shapes only; GPTQ weights with known values → repack → the Marlin backend against the
torch reference; exit 1 on mismatch. --prepare-only: import and JIT-build the kernels for this device, no
weights (run before the service stops). Staged (RUNNER_STAGED=1, payload.staged): the import and the backend's
import run first, while the service still serves; then the line {"event": "staged"} and a wait for `go` on
stdin before anything touches GPU memory (EOF: the supervisor is gone, exit 1 with no run).
Exit codes: 0 ok · 1 run failed or check mismatch · 2 bad arguments.
"""
import time

PROCESS_START = time.time()          # before any import: "seconds from start" includes importing torch

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

from marlin_check import check  # noqa: E402
from marlin_env import (  # noqa: E402
    backend_version,
    build_backend,
    built_modules,
    environment,
    gpu_clocks,
    gpu_selector,
    jit_cache_dirs,
    load_backend,
    own_gpu_memory_mib,
    reason_of,
    slow_phase_hook,
    start_full_import_probe,
)
from marlin_estimate import Shape, estimate, estimate_from_args, expert_bytes, weight_bytes  # noqa: E402
from marlin_events import Events  # noqa: E402
from marlin_stats import ORDERS, add_levers, floor_us, lever_summary, timing_row, window_order  # noqa: E402

BACKENDS = ("auto", "sglang", "sglang-kernels", "torch")
AUTO_ORDER = ("sglang", "sglang-kernels", "torch")
GROUP_SIZES = (32, 64, 128)
CHECK_MAX_WEIGHT_BYTES = 1 << 30     # the check holds GPTQ and Marlin copies and loops experts in fp32


def batch_size_list(text: str) -> list[int]:
    try:
        sizes = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"batch sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or any(m <= 0 for m in sizes) or len(set(sizes)) != len(sizes):
        raise argparse.ArgumentTypeError(f"batch sizes must be distinct positive integers, got {text!r}")
    return sorted(sizes)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)  # a near miss such as --batch-size is a typo, not --batch-sizes
    p.add_argument("--experts", type=int, default=384)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--intermediate", type=int, default=2048)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--group-size", type=int, default=32, choices=GROUP_SIZES)
    p.add_argument("--batch-sizes", type=batch_size_list, default=batch_size_list("1,2,4,8,16,32,64,128,256,512"))
    p.add_argument("--backend", choices=BACKENDS, default="auto")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weights", choices=("direct", "repack"), default="direct")
    p.add_argument("--routing", choices=("uniform", "zipf"), default="uniform")
    p.add_argument("--zipf-skew", type=float, default=1.1)
    p.add_argument("--timing", choices=("graph", "eager"), default="graph")
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--order", choices=ORDERS, default="interleave",
                   help="order of the timed windows: every batch size once per repetition, shuffled (random), "
                        "up and down in turn (alternating), or light and heavy in turn, the same each repetition "
                        "(interleave); ascending = the old order, all repetitions of one M")
    p.add_argument("--order-seed", type=int, default=None, help="seed of the random order (default: --seed)")
    p.add_argument("--settle", choices=("none", "idle", "busy", "cool"), default="busy",
                   help="before each timed window: nothing, an idle pause, the window's own call untimed (busy), "
                        "or idle until the GPU is back within --cool-c of the first window's temperature "
                        "(at most --cool-max-ms), then busy (cool)")
    p.add_argument("--settle-ms", type=float, default=200.0)
    p.add_argument("--cool-c", type=float, default=3.0, help="--settle cool: degrees above the first window's start")
    p.add_argument("--cool-max-ms", type=float, default=3000.0, help="--settle cool: the longest idle wait per window")
    p.add_argument("--prepare-only", action="store_true",
                   help="import and JIT-build the kernels for this device's arch, then exit: no weights, no timing")
    p.add_argument("--out", default=os.environ.get("RUNNER_RESULT", "result.json"))
    p.add_argument("--check", action="store_true", help="correctness check at small shapes, no timing")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--heartbeat-s", type=float, default=5.0, help="seconds between heartbeats (<= 10)")
    # test-only hooks, hidden from --help
    p.add_argument("--corrupt-scale-perm", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--test-slow-phase", default=None, help=argparse.SUPPRESS)      # PHASE:SECONDS
    return p


def shape_problems(a: argparse.Namespace) -> list[str]:
    problems = []
    for name in ("experts", "hidden", "intermediate", "topk", "iterations", "repeats"):
        if getattr(a, name) <= 0:
            problems.append(f"--{name} must be positive")
    if a.topk > a.experts:
        problems.append(f"--topk {a.topk} is more than --experts {a.experts}")
    for name in ("hidden", "intermediate"):
        value = getattr(a, name)
        if value % a.group_size or value % 64:
            problems.append(f"--{name} {value} must be a multiple of --group-size {a.group_size} and of 64 "
                            "(the Marlin tile)")
    if not 0 < a.heartbeat_s <= 10:
        problems.append("--heartbeat-s must be in (0, 10]")
    if a.routing == "zipf" and a.zipf_skew <= 0:
        problems.append("--zipf-skew must be positive")
    if a.device == "cpu" and a.backend in ("sglang", "sglang-kernels"):
        problems.append(f"--backend {a.backend} needs --device cuda")
    if a.check and a.backend == "torch":
        problems.append("--check compares a Marlin backend with the torch reference: pick auto, sglang or sglang-kernels")
    if a.check and a.device == "cpu":
        problems.append("--check runs the Marlin kernels: it needs --device cuda")
    if a.prepare_only and a.check:
        problems.append("--prepare-only builds the kernels and exits: it cannot be combined with --check")
    problems += [f"--{name} must not be negative" for name, value in
                 (("settle-ms", a.settle_ms), ("cool-c", a.cool_c), ("cool-max-ms", a.cool_max_ms)) if value < 0]
    return problems


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    problems = shape_problems(args)
    if args.check:
        shape = shape_of(args)
        if weight_bytes(shape) > CHECK_MAX_WEIGHT_BYTES:
            problems.append(f"--check is for small shapes: weights of at most {CHECK_MAX_WEIGHT_BYTES >> 20} MiB "
                            "(try --experts 16)")
    if problems:
        parser.error("; ".join(problems))          # exits 2
    return args


def estimate_peak_bytes(args: argparse.Namespace) -> int:
    """Free GPU memory this run needs to start, from parse_args' answer alone (pure, no torch): what runner's
    `gpu.min_free_mib: auto` asks for."""
    return estimate_from_args(vars(args)).required_bytes


def shape_of(a: argparse.Namespace) -> Shape:
    return Shape(a.experts, a.hidden, a.intermediate, a.topk, a.group_size)


# -- the run ---------------------------------------------------------------------------------------------

class Bench:
    def __init__(self, args: argparse.Namespace, events: Events):
        self.args, self.events = args, events
        self.shape = shape_of(args)
        self.result: dict = {"schema": 1, "payload": "bench_marlin_moe", "args": vars(args).copy()}
        self.imported: dict = {}  # backend → (handle, None) or (None, the import's exception), in the order tried

    def run(self) -> int:
        a, ev = self.args, self.events
        with ev.phase("import"):
            probe = self.start_probe()
            import torch
            self.torch = torch
            self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
            self.device = a.device
            if self.device == "cuda" and not torch.cuda.is_available():
                raise RuntimeError("--device cuda but torch sees no CUDA device")
            self.result["environment"] = environment(torch, self.device)
            slow_phase_hook(a.test_slow_phase, "import")
        if a.prepare_only:
            return self.prepare(probe)
        if os.environ.get("RUNNER_STAGED") == "1":  # GPU-free so far; the GPU is ours only after `go`
            self.import_first(probe)
            ev.wait_for_go()
        self.measure_copy_bandwidth()
        self.statics = self.allocate_statics()
        modules_before = built_modules()
        reference_weights = self.start_backend(probe)
        self.result["jit"] = self.jit_record(modules_before)
        if a.check:
            return check(self, reference_weights)
        self.time_all()
        return 0

    def prepare(self, probe) -> int:
        """--prepare-only: import the backend and build its JIT kernels for this device, nothing else (the
        supervisor runs this before stopping the service, so the compile is not downtime)."""
        ev = self.events
        modules_before = built_modules()
        name = self.import_first(probe)
        attempts = [{"backend": candidate, "ok": False, "stage": "import", "reason": reason_of(error)}
                    for candidate, (_, error) in self.imported.items() if error is not None]
        prepare = {"backend": name, "attempts": attempts, "kernels": [], "arch": None}
        self.result["prepare"] = prepare
        if name in ("sglang", "sglang-kernels"):
            with ev.phase("jit", prepare=True):
                prepare["kernels"] = self.mb.build_jit_kernels(self.dtype)
            prepare["arch"] = self.mb.jit_arch()
        self.result["jit"] = self.jit_record(modules_before)
        self.result["environment"]["gpu_process_used_mib"] = own_gpu_memory_mib()
        ev.emit("prepared", backend=name, kernels=prepare["kernels"], arch=prepare["arch"])
        if name is None:
            raise self.mb.BackendUnavailable("no backend could be imported: " + "; ".join(
                f"{x['backend']}: {x['reason']}" for x in attempts))
        gemm = [k for k in prepare["kernels"] if k["kernel"] == "moe_wna16_marlin"]
        return 1 if gemm and not gemm[0]["ok"] else 0

    def import_first(self, probe):
        """Import the backends in the order a run tries them until one imports (no GPU memory needed); each
        outcome is kept for the run. Returns the name of the one that imported, or None."""
        for name in AUTO_ORDER if self.args.backend == "auto" else (self.args.backend,):
            try:
                with self.events.phase("load", backend=name):
                    self.imported[name] = (load_backend(name, self.device, self.mb, probe), None)
                return name
            except Exception as exc:  # auto moves on, the reason is kept
                self.imported[name] = (None, exc)
        return None

    def load(self, name: str, probe):
        """The backend's import: its outcome from staging when it was tried then, else imported now."""
        if name in self.imported:
            handle, error = self.imported[name]
            if error is not None:
                raise error
            return handle
        with self.events.phase("load", backend=name):
            return load_backend(name, self.device, self.mb, probe)

    def start_backend(self, probe):
        """The requested backend, or with auto the first in AUTO_ORDER that imports, builds its weights,
        constructs and survives a first call; each failure and its stage go to result.json. Returns the GPTQ
        weights of --check (None otherwise)."""
        a, ev = self.args, self.events
        attempts = []
        for name in AUTO_ORDER if a.backend == "auto" else (a.backend,):
            self.name, stage = name, "import"
            try:
                handle = self.load(name, probe)
                stage = "weights"
                with ev.phase("weights", mode="check" if a.check else a.weights):
                    self.weights, gptq = self.make_weights(handle)
                stage = "construct"
                self.backend = build_backend(name, handle, self.shape, self.weights, max(a.batch_sizes))
                stage = "first_call"
                self.first_call()
            except Exception as exc:  # auto moves on from any failure; the reason and the stage are kept
                attempts.append({"backend": name, "ok": False, "stage": stage, "reason": reason_of(exc)})
                ev.emit("backend", backend=name, ok=False, stage=stage, reason=reason_of(exc))
                self.release_backend()
                continue
            attempts.append({"backend": name, "ok": True, "stage": "first_call", "reason": "ran its first call"})
            ev.emit("backend", backend=name, ok=True)
            self.record_backend(handle, attempts)
            return gptq
        self.result["backend"] = {"requested": a.backend, "used": None, "attempts": attempts}
        raise self.mb.BackendUnavailable("no backend could run: " + "; ".join(
            f"{x['backend']} ({x['stage']}): {x['reason']}" for x in attempts))

    @property
    def mb(self):
        import marlin_backends
        return marlin_backends

    def release_backend(self) -> None:
        """Drop what a failed backend built, so the next one starts from the same free memory."""
        self.backend = self.weights = None
        self._weights_cache = None
        if self.device == "cuda":
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()

    def record_backend(self, handle, attempts: list[dict]) -> None:
        self.result["environment"]["sglang"] = backend_version(self.name, handle)
        self.result["environment"]["sgl_kernel"] = getattr(sys.modules.get("sgl_kernel"), "__version__", None)
        record = {"requested": self.args.backend, "used": self.name, "attempts": attempts,
                  "why": self.why_backend(attempts)}
        if self.name == "sglang-kernels":
            record["sequence"] = handle.sequence()
        elif self.name == "sglang":
            record["keywords"] = sorted(self.backend.kwargs)
        self.result["backend"] = record

    def start_probe(self):
        if self.args.device != "cuda" or self.args.backend not in ("auto", "sglang"):
            return None
        return start_full_import_probe()

    def why_backend(self, attempts: list[dict]) -> str:
        failed = [f"{x['backend']} failed at {x['stage']} ({x['reason']})" for x in attempts if not x["ok"]]
        chosen = "requested" if self.args.backend != "auto" else \
            "first that runs in auto order " + ", ".join(AUTO_ORDER)
        return "; ".join([chosen] + failed)

    def measure_copy_bandwidth(self) -> None:
        if self.device != "cuda":
            self.result["copy_bandwidth"] = None
            return
        from marlin_timing import copy_bandwidth
        torch = self.torch
        free, total = torch.cuda.mem_get_info()
        self.context_used = total - free
        with self.events.phase("copy_bandwidth"):
            self.result["copy_bandwidth"] = copy_bandwidth(self.device)
        torch.cuda.reset_peak_memory_stats()
        self.device_used_peak = 0

    def make_weights(self, handle):
        """(weights for the backend, GPTQ weights for the reference or None); a backend that failed after
        building Marlin weights leaves them to the next Marlin backend."""
        import marlin_weights as mw
        a, s = self.args, self.shape
        layout = "gptq" if self.name == "torch" else "marlin"
        cached = getattr(self, "_weights_cache", None)
        if cached and cached[0] == layout:
            self.result["weights"] = cached[3]
            return cached[1], cached[2]
        if a.check:
            built = "GPTQ with known values, repacked expert by expert"
            gptq = mw.known_gptq_weights(s, self.dtype, self.device, a.seed)
            weights = mw.repack_weights(gptq, s, handle_repack(self.name, handle), a.corrupt_scale_perm)
        elif a.weights == "repack" and layout == "marlin":
            built, gptq = "random GPTQ experts repacked one at a time into a preallocated destination", None
            weights = mw.random_repacked_weights(s, self.dtype, self.device, a.seed, handle_repack(self.name, handle))
        else:
            built, gptq = f"random bits straight in the {layout} layout", None
            weights = mw.direct_weights(s, layout, self.dtype, self.device, a.seed)
        self.result["weights"] = {"requested": a.weights, "built": built, "layout": layout}
        self._weights_cache = (layout, weights, gptq, self.result["weights"])
        return weights, gptq

    def allocate_statics(self):
        from marlin_timing import allocate_statics
        return allocate_statics(max(self.args.batch_sizes), self.shape, self.dtype, self.device)

    def first_call(self) -> None:
        """The first call JIT-compiles the GEMM when the cache is cold (minutes, silent): heartbeats run."""
        import marlin_weights as mw
        from marlin_timing import routing, static_views
        m = min(self.args.batch_sizes)
        with self.events.phase("jit", m=m):
            gen = mw.generator("cpu", self.args.seed + 1)
            w, ids = routing(m, self.shape, self.args.routing, self.args.zipf_skew, gen)
            statics = static_views(m, self.statics)
            statics.topk_w.copy_(w)
            statics.topk_ids.copy_(ids)
            statics.x.copy_(self.torch.randn(m, self.shape.hidden, generator=gen).to(self.dtype))
            out = self.backend(statics.x, statics.topk_w, statics.topk_ids, self.backend.buffers(m))
            self.synchronize()
            if not bool(self.torch.isfinite(out).all()):
                raise RuntimeError("the first call returned non-finite values")
            slow_phase_hook(self.args.test_slow_phase, "jit")

    def jit_record(self, modules_before: set[str]) -> dict:
        new = sorted(built_modules() - modules_before)
        seconds = self.events.phase_seconds.get("jit", 0.0)
        repack_s = self.events.phase_seconds.get("weights", 0.0) if any("repack" in p for p in new) else 0.0
        compile_s = seconds + repack_s
        return {"state": "cold" if new else "warm", "first_call_s": seconds, "compile_s": compile_s if new else 0.0,
                "new_modules": new, "cache_dirs": jit_cache_dirs()}

    def synchronize(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    # -- timing --

    def time_all(self) -> None:
        a = self.args
        timing_mode = a.timing
        why = "as requested"
        if a.timing == "graph" and (self.device != "cuda" or not self.backend.graph_safe):
            timing_mode, why = "eager", "CUDA graphs need --device cuda and a capturable backend"
        order_seed = a.seed if a.order_seed is None else a.order_seed
        windows = window_order(a.batch_sizes, a.repeats, a.order, order_seed)
        self.result["timing"] = {"requested": a.timing, "used": timing_mode, "why": why,
                                 "iterations": a.iterations, "repeats": a.repeats,
                                 "order": {"mode": a.order, "seed": order_seed, "windows": [m for _, m in windows]},
                                 "settle": {"mode": a.settle, "ms": a.settle_ms}}
        if a.settle == "cool":
            self.result["timing"]["settle"].update(cool_c=a.cool_c, cool_max_ms=a.cool_max_ms)
        from marlin_timing import nvml_sampler
        self.gpu_state = nvml_sampler(self.torch) if self.device == "cuda" else None
        selector = gpu_selector(self.torch, self.device)
        start = gpu_clocks(selector)
        timed = self.time_windows(windows, timing_mode)
        self.result["gpu_clocks"] = clocks_record(selector, start, gpu_clocks(selector))
        rows = [self.row_of(m, timed[m], timing_mode) for m in a.batch_sizes]
        capped = sum(r.get("capped_windows") or 0 for r in rows)
        self.result["timing"]["capped_windows"] = capped if self.gpu_state else None
        self.finish(add_levers(rows))

    def time_windows(self, windows: list[tuple[int, int]], mode: str) -> dict[int, list[dict]]:
        """Time each (repetition, m) window in the given order. A batch size is prepared (rotation sets,
        buffers, graph, warm-up) at its first window and dropped after its last, so the ascending order holds
        one batch size's buffers at a time, as before, and an interleaved order holds all of them."""
        a = self.args
        last = {m: i for i, (_, m) in enumerate(windows)}
        live = {}
        timed: dict[int, list[dict]] = {m: [] for m in a.batch_sizes}
        for index, (rep, m) in enumerate(windows):
            if m not in live:
                live[m] = self.prepare_window(m, mode)
            window = live[m]
            cooled = self.cool_down(timed) if a.settle == "cool" else None
            window.settle("busy" if a.settle == "cool" else a.settle, a.settle_ms)
            start = self.gpu_state() if self.gpu_state else None
            with self.events.phase("batch", m=m, rep=rep):
                samples, end = window.time(a.iterations, self.gpu_state)
            timed[m].append({"rep": rep, "index": index, "samples": samples, "start": start, "end": end,
                             "distinct": window.sets.distinct_experts, **({"cooled": cooled} if cooled else {})})
            self.events.emit("window", m=m, rep=rep, index=index, median_us=statistics.median(samples),
                             capped=window_capped(start, end))
            if "first_row_s" not in self.result:
                self.result["first_row_s"] = self.events.since_start()
            if last[m] == index:
                self.sample_device_memory()
                del live[m]
        return timed

    def cool_down(self, timed: dict[int, list[dict]]) -> dict | None:
        """--settle cool: idle until the GPU's temperature is within cool_c of the first window's start (the
        slow state that sets the clock under the power cap), at most cool_max_ms. Outside the timed window."""
        if not self.gpu_state:
            return None
        first = min((w for ws in timed.values() for w in ws), key=lambda w: w["index"], default=None)
        if first is None or not first.get("start"):
            return None
        target = first["start"]["temp_c"] + self.args.cool_c
        began = time.perf_counter()
        deadline = began + self.args.cool_max_ms / 1000.0
        temp = self.gpu_state()["temp_c"]
        while temp > target and time.perf_counter() < deadline:
            time.sleep(0.05)
            temp = self.gpu_state()["temp_c"]
        return {"waited_ms": round((time.perf_counter() - began) * 1000.0, 1), "temp_c": temp, "target_c": target}

    def prepare_window(self, m: int, mode: str):
        import marlin_weights as mw
        from marlin_timing import Window, capture_graph, rotation_sets, static_views
        a = self.args
        gen = mw.generator("cpu", a.seed * 1000003 + m)
        sets = rotation_sets(m, self.shape, a.routing, a.zipf_skew, self.dtype, self.device, gen)
        statics = static_views(m, self.statics)
        buffers = self.backend.buffers(m)

        def eager() -> object:
            return self.backend(statics.x, statics.topk_w, statics.topk_ids, buffers)

        call = eager
        if mode == "graph":
            sets.load(0, statics)
            with self.events.phase("capture", m=m):
                graph, _ = capture_graph(eager)
            call = graph.replay
        window = Window(call, sets, statics, self.device == "cuda")
        window.warm_up()
        window.graph_and_buffers = (call, buffers)          # alive while this batch size has windows left
        return window

    def row_of(self, m: int, windows: list[dict], mode: str) -> dict:
        from marlin_timing import ROTATION_SETS, WARMUP_CALLS
        windows = sorted(windows, key=lambda w: w["rep"])
        row = timing_row(m, [w["samples"] for w in windows], windows[0]["distinct"], expert_bytes(self.shape),
                         self.copy_rate())
        row.update(rotation_sets=ROTATION_SETS, warmup_calls=WARMUP_CALLS, timing=mode)
        row["windows"] = [{"rep": w["rep"], "index": w["index"], "median_us": statistics.median(w["samples"]),
                           "start": w["start"], "end": w["end"], "capped": window_capped(w["start"], w["end"]),
                           **({"cooled": w["cooled"]} if w.get("cooled") else {})} for w in windows]
        if self.gpu_state:
            row["gpu_state"] = [w["end"] for w in windows]
            row["capped_windows"] = sum(1 for w in row["windows"] if w["capped"])
        self.events.emit("row", **{k: v for k, v in row.items() if k not in ("rep_median_us", "gpu_state", "windows")})
        return row

    def copy_rate(self) -> float | None:
        copy = self.result.get("copy_bandwidth")
        return copy["bytes_per_s"] if copy else None

    def sample_device_memory(self) -> None:
        if self.device == "cuda":
            free, total = self.torch.cuda.mem_get_info()
            self.device_used_peak = max(self.device_used_peak, total - free)

    def finish(self, rows: list[dict]) -> None:
        self.result["rows"] = rows
        self.result["lever"] = lever_summary(rows)
        self.result["memory"] = self.memory_record()
        copy = self.copy_rate()
        base = rows[0]
        if copy:
            floor = floor_us(base["distinct_experts"], expert_bytes(self.shape), copy)
            self.result["floor"] = {"m": base["m"], "floor_us": floor, "measured_us": base["median_us"],
                                    "over_floor": base["median_us"] / floor}

    def memory_record(self) -> dict:
        a = self.args
        est = estimate(self.shape, a.batch_sizes, backend=self.name, weights=a.weights,
                       sms=self.result["environment"].get("sms", 132), order=a.order)
        record = {"weight_bytes": self.weights.nbytes(), "estimate": est.as_dict()}
        if self.device == "cuda":
            peak = self.torch.cuda.max_memory_allocated()
            record.update(peak_allocated_bytes=peak, peak_reserved_bytes=self.torch.cuda.max_memory_reserved(),
                          peak_over_weights=peak / self.weights.nbytes(),
                          device_used_peak_bytes=self.device_used_peak, context_used_bytes=self.context_used,
                          estimate_over_peak=est.peak_allocated_bytes / peak,
                          required_over_device_used=est.required_bytes / self.device_used_peak)
        return record


def clocks_record(selector: str, start: dict | None, end: dict | None) -> dict | None:
    """The GPU's clocks at the start and end of the timed part (nvidia-smi's -i SELECTOR); None when
    nvidia-smi answered neither time (missing, failed): the run is never failed for it."""
    if start is None and end is None:
        return None
    return {"gpu": selector, "source": "nvidia-smi", "start": start, "end": end}


def window_capped(start: dict | None, end: dict | None) -> bool | None:
    """Whether a power or thermal cap held the clock down at the start or during a window (None without NVML)."""
    states = [x for x in (start, end) if x]
    return any(x.get("capped") for x in states) if states else None


def handle_repack(name: str, handle):
    import marlin_backends as mb
    return handle.repack if name == "sglang-kernels" else mb.repack_function()


def write_result(result: dict, path: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(result, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main(argv=None) -> int:
    args = parse_args(argv)
    events = Events(PROCESS_START, heartbeat_s=args.heartbeat_s)
    bench = Bench(args, events)
    try:
        code = bench.run()
    except Exception as exc:                            # the event line and result say what failed
        events.emit("error", error=f"{type(exc).__name__}: {exc}")
        bench.result["error"] = f"{type(exc).__name__}: {exc}"
        code = 1
    bench.result["phases"] = events.phase_seconds
    bench.result["total_s"] = events.since_start()
    write_result(bench.result, args.out)
    events.emit("done", exit_code=code, result=os.path.abspath(args.out))
    return code


if __name__ == "__main__":
    sys.exit(main())
