"""The Marlin benchmark's surroundings: the machine and packages it records (environment, nvidia-smi), the
backends it loads (the full-import probe in a child, the kernel modules) and the JIT cache it inspects.
Imported by bench_marlin_moe.py as a sibling script module (sys.path[0] is this directory)."""
import glob
import os
import platform
import subprocess
import sys
import time

from marlin_estimate import Shape

FULL_IMPORT = "from sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe import fused_marlin_moe"


# -- environment and backends -----------------------------------------------------------------------------

def parse_compute_apps(text: str, pid: int) -> int | None:
    """MiB used by process `pid` in `nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`."""
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid) and fields[1].isdigit():
            return int(fields[1])
    return None


def nvidia_smi(*query: str) -> str | None:
    """nvidia-smi's stdout, or None when it is missing, fails or hangs."""
    try:
        done = subprocess.run(["nvidia-smi", *query], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def own_gpu_memory_mib() -> int | None:
    """MiB this process holds on the GPU as nvidia-smi lists it; None when it is not listed (no context)."""
    text = nvidia_smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    return None if text is None else parse_compute_apps(text, os.getpid())


def gpu_driver() -> str | None:
    text = (nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader") or "").strip()
    return text.splitlines()[0] if text else None


# What the GPU ran at: nvidia-smi's documented --query-gpu fields (`nvidia-smi --help-query-gpu`), in order.
CLOCK_FIELDS = ("index", "clocks.sm", "clocks.mem", "temperature.gpu", "power.limit")
CLOCK_KEYS = ("index", "sm_mhz", "mem_mhz", "temp_c", "power_limit_w")


def parse_gpu_clocks(text: str) -> dict | None:
    """The first card's line of `nvidia-smi --query-gpu=<CLOCK_FIELDS> --format=csv,noheader,nounits -i GPU`
    as {index, sm_mhz, mem_mhz, temp_c, power_limit_w}; a cell nvidia-smi cannot read ([N/A],
    [Not Supported]) is None; None when there is no line of that shape."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == len(CLOCK_KEYS) and cells[0].isdigit():
            values = [_number(c) for c in cells]
            return dict(zip(CLOCK_KEYS, [int(cells[0])] + values[1:]))  # the index: digits only
    return None


def _number(cell: str) -> float | int | None:
    try:
        value = float(cell)
    except ValueError:
        return None
    return int(value) if value.is_integer() else value


def gpu_selector(torch, device: str) -> str:
    """How nvidia-smi's -i names this process's GPU: its UUID on CUDA (whatever CUDA_VISIBLE_DEVICES says),
    else the first visible device, else card 0."""
    if device == "cuda":
        uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", "") or "")
        if uuid:
            return uuid if uuid.startswith("GPU-") else "GPU-" + uuid
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or "0"


def gpu_clocks(selector: str) -> dict | None:
    """The GPU's clocks, temperature and power limit now; None without nvidia-smi or an answer it can parse."""
    text = nvidia_smi("--query-gpu=" + ",".join(CLOCK_FIELDS), "--format=csv,noheader,nounits", "-i", selector)
    return None if text is None else parse_gpu_clocks(text)


def package_version(name: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment(torch, device: str) -> dict:
    sgl_kernel = sys.modules.get("sgl_kernel")          # loaded by the sglang backends, not imported here
    env = {"python": platform.python_version(), "torch": torch.__version__, "device": device,
           "triton": package_version("triton"), "sgl_kernel": getattr(sgl_kernel, "__version__", None)}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, sms=props.multi_processor_count, gpu_total_bytes=props.total_memory,
                   capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                   cuda=torch.version.cuda, driver=gpu_driver())
    return env


def start_full_import_probe() -> subprocess.Popen:
    """Try the full import in a child process (a half-finished import would leave this process unusable);
    started before this process imports torch, so the two imports overlap."""
    return subprocess.Popen([sys.executable, "-c", FULL_IMPORT], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def finish_full_import_probe(probe: subprocess.Popen, timeout_s: float = 90.0) -> tuple[bool, str]:
    try:
        _, stderr = probe.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        probe.kill()
        probe.communicate()
        return (False, f"full import took over {timeout_s:.0f} s")
    if probe.returncode == 0:
        return True, "full import works"
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    return (False, lines[-1] if lines else f"import exited {probe.returncode}")


def reason_of(exc: Exception) -> str:
    import marlin_backends as mb
    return str(exc) if isinstance(exc, mb.BackendUnavailable) else f"{type(exc).__name__}: {exc}"


def load_backend(name: str, device: str, mb, probe):
    if name != "torch" and device != "cuda":
        raise mb.BackendUnavailable("needs a CUDA device")
    if name == "sglang":
        ok, reason = finish_full_import_probe(probe)
        if not ok:
            raise mb.BackendUnavailable(reason)
        return mb.import_fused()
    if name == "sglang-kernels":
        return mb.import_kernel_modules()
    return None


def build_backend(name: str, handle, shape: Shape, weights, m_max: int):
    import marlin_backends as mb
    if name == "sglang":
        fused, version = handle
        return mb.SglangFused(shape, weights, fused, version, m_max)
    if name == "sglang-kernels":
        return mb.SglangKernels(shape, weights, handle)
    return mb.TorchReference(shape, weights)


def backend_version(name: str, handle) -> str | None:
    if name == "sglang":
        return handle[1]
    if name == "sglang-kernels":
        return handle.version
    return None


# -- JIT cache --------------------------------------------------------------------------------------------

def jit_cache_dirs() -> list[str]:
    """Where sglang keeps built kernel modules: 0.5.17 uses tvm-ffi's cache, 0.5.23 its own."""
    return [os.path.expanduser(os.environ.get("TVM_FFI_CACHE_DIR", "~/.cache/tvm-ffi")),
            os.path.expanduser(os.environ.get("SGLANG_JIT_CACHE_DIR", "~/.cache/sglang/jit"))]


def built_modules() -> set[str]:
    return {path for d in jit_cache_dirs() for path in glob.glob(os.path.join(d, "**", "*.so"), recursive=True)}


def slow_phase_hook(spec: str | None, phase: str) -> None:
    """Test hook: make one phase take SECONDS longer, so a test can see its heartbeats."""
    if spec and spec.split(":")[0] == phase:
        time.sleep(float(spec.split(":")[1]))
