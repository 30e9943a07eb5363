#!/bin/bash
# Here (no GPU; pip, nvcc 13.0 at /usr/local/cuda, a python3 with torch — a CPU build is enough): assemble the folder
# DEST that one device call carries to run a REAL SGLang 0.5.17 server on the H200 machine (image: Python 3.12,
# torch 2.11.0+cu130, triton 3.6.0, uvloop, psutil, aiohttp, httpx, huggingface_hub, ... but no sglang).
#   bash results/h200/sglang/prepare_carry.sh DEST      (DEST e.g. build/sglang-real/dev, ignored by git)
# DEST gets: site312.tar.xz (every Python package the server, the payload and runner need beyond the image, 45 MB),
# the flashinfer norm module prebuilt for sm_90a inside it, jit-sm90a.tar.xz (the payload's Marlin JIT cache, from
# ../shared/device/prebuild-sglang-jit-sm90a.sh), systemd/ (Debian's systemd 252 debs, ../shared/device/gpu-systemd/
# prepare.sh), gpu-systemd/host.sh, rwhl/ (tenacity, platformdirs for runner), tiny-llama/config.json and the two
# device scripts. ~52 MB: with the repo (~7 MB) one call carries it (64 MiB).
# Needs: SYSTEMD_DEBS (folder of prepare.sh's debs), JIT_TAR (prebuild's jit-sm90a.tar.xz), KERNEL_TGZ (the
# sgl_kernel_sm90.tgz of ../shared/device/prepare-sglang-carry.sh), HOST_SH (../shared/device/gpu-systemd/host.sh).
# ~6 min on 2 cores (xz -9 of 270 MB, the norm module's nvcc).
set -euo pipefail
dest=$(mkdir -p "${1:?usage: prepare_carry.sh DEST}" && cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
: "${SYSTEMD_DEBS:?}" "${JIT_TAR:?}" "${KERNEL_TGZ:?}" "${HOST_SH:?}"
PY=${PY:-python3}
plat="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64"
# beyond the image: sglang's pins (transformers 5.12.1 + tokenizers 0.22.2, xgrammar, flashinfer-python, openai, ...),
# the server's web stack (fastapi + its opentelemetry-api, uvicorn, python-multipart, starlette), what its import
# reaches at module level (soundfile + cffi, zstandard, jsonschema, setproctitle, interegular, easydict),
# the kernel runtime (apache-tvm-ffi, msgspec, pybase64, pydantic) and torch_memory_saver
pkgs="sglang==0.5.17 transformers==5.12.1 tokenizers==0.22.2 orjson==3.13.0 starlette==1.10.0 pyzmq==27.3.0 dill==0.4.1
  openai==2.6.1 sniffio==1.3.1 distro==1.9.0 jiter==0.19.0 partial-json-parser==0.2.1.1.post7 xgrammar==0.2.1
  compressed-tensors==0.20.1 loguru==0.7.3 gguf==0.19.0 flashinfer-python==0.6.15.post1 apache-tvm-ffi==0.1.11
  msgspec==0.23.0 pybase64==1.5.1 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  torch_memory_saver==0.0.10 fastapi==0.165.0 uvicorn==0.54.0 python-multipart==0.0.34 setproctitle==1.3.8
  interegular==0.3.3 easydict==1.14 zstandard==0.25.0 soundfile==0.13.1 cffi==2.1.1 pycparser==3.12
  opentelemetry-api==1.45.2 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
$PY -m pip download -q --no-deps $plat -d "$tmp/whl" $pkgs
site=$tmp/site
$PY -m pip install -q --no-deps --no-compile --no-index $plat --target "$site" $(ls "$tmp"/whl/*.whl | grep -v /sglang-0.5.17)
# sglang from its wheel; the Rust front ends (SGLANG_RUST_SERVER, gRPC, multimodal preprocessing, 23 MB) are not used
(cd "$site" && unzip -q "$tmp"/whl/sglang-0.5.17-*.whl 'sglang/*' && rm -f sglang/srt/server/_core*.so \
  sglang/srt/grpc/_core*.so sglang/srt/multimodal/_core*.so)
# the flashinfer norm module (sgl_kernel's rmsnorm calls flashinfer's when it imports) built here for sm_90a and put
# where flashinfer looks for AOT modules; then its JIT sources (76 MB) stay behind
# (built with THIS interpreter's flashinfer + tvm-ffi: the site's binaries are for the device's 3.12)
$PY -m pip install -q --no-deps --only-binary=:all: --target "$tmp/fisite" flashinfer-python==0.6.15.post1 \
  apache-tvm-ffi==0.1.11 nvidia-ml-py einops tabulate tqdm click packaging requests urllib3 idna certifi \
  charset-normalizer ninja cuda-bindings cuda-pathfinder
mkdir -p "$tmp/inc"
$PY -m pip download -q --no-deps $plat -d "$tmp/cuda" "nvidia-cublas>=13,<14" "nvidia-curand>=10.4,<11"
for w in "$tmp"/cuda/*.whl; do unzip -q -o -j "$w" '*/include/*' -d "$tmp/inc"; done
mkdir -p "$tmp/stub" && echo "" | gcc -shared -o "$tmp/stub/libcuda.so" -Wl,-soname,libcuda.so.1 -x c -  # link-time stand-in
PYTHONPATH=$tmp/fisite CPATH=$tmp/inc LIBRARY_PATH=$tmp/stub FLASHINFER_WORKSPACE_BASE=$tmp/fiws FLASHINFER_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda \
  $PY -c "from flashinfer.jit.norm import gen_norm_module as g; s = g(); s.build(verbose=False); print(s.jit_library_path)"
so=$(find "$tmp/fiws" -name norm.so | head -1)
rm -rf "$site/flashinfer/data" "$site/xgrammar/lib" "$site/bin" "$site/zstandard/_cffi"*.so
mkdir -p "$site/flashinfer/data/aot/norm" && cp "$so" "$site/flashinfer/data/aot/norm/norm.so"
find "$site" -name __pycache__ -prune -exec rm -rf {} +
tar xzf "$KERNEL_TGZ" -C "$site"                     # sgl_kernel 0.4.5, its sm90 common_ops only
mkdir -p "$site/IPython" && : > "$site/IPython/__init__.py"   # sglang's kernel modules import IPython.display
printf 'def display(*a, **k):\n    pass\n\n\nclass HTML:\n    def __init__(self, *a, **k):\n        pass\n' > "$site/IPython/display.py"
XZ_OPT="-9 -T0" tar cJf "$dest/site312.tar.xz" -C "$site" .
mkdir -p "$dest/systemd" "$dest/gpu-systemd" "$dest/rwhl" "$dest/tiny-llama"
cp "$SYSTEMD_DEBS"/*.deb "$dest/systemd/"; cp "$JIT_TAR" "$dest/jit-sm90a.tar.xz"
cp "${HOST_SH:?the confined systemd script: ../shared/device/gpu-systemd/host.sh}" "$dest/gpu-systemd/"
$PY -m pip download -q --no-deps --only-binary=:all: -d "$dest/rwhl" tenacity==9.2.1 platformdirs==4.14.9
cp "$here/tiny-llama.json" "$dest/tiny-llama/config.json"
cp "$here/run_on_device.sh" "$here/measure.sh" "$dest/"
du -sh "$dest"; ls -la "$dest"
