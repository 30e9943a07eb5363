#!/bin/bash
# Here (no GPU; apt, pip, nvcc 13.0 at /usr/local/cuda), from the repo root, in one command: the whole carry of
# the real-SGLang recipe, from nothing: Debian's systemd debs, sgl_kernel's sm90 part, a torch 2.13 CPU venv for
# the JIT prebuild, the Marlin JIT cache, then prepare_carry.sh. Each step is skipped when its output exists.
#   SHARED=../shared bash results/h200/sglang/make_carry.sh [DEST]     (DEST default build/sglang-real/dev)
# Measured 2026-12-02 on this 2-core machine at nice 19 beside a CI run: ~12 min, 47 MB.
set -euxo pipefail
repo=$(pwd); S=$(cd "${SHARED:-../shared}/device" && pwd); dest=${1:-build/sglang-real/dev}
b=$repo/build
[ -d $b/carry/systemd ] || bash $S/gpu-systemd/prepare.sh $b/carry/systemd
[ -f $b/gpu26/kcarry/sgl_kernel_sm90.tgz ] || bash $S/prepare-sglang-carry.sh $b/gpu26/kcarry
[ -x $b/torchvenv/bin/python ] || { python3 -m venv $b/torchvenv; $b/torchvenv/bin/pip install -q torch==2.13.0 numpy; }
[ -f $b/gpu26/jit/jit-sm90a.tar.xz ] || PATH=$b/torchvenv/bin:$PATH bash $S/prebuild-sglang-jit-sm90a.sh $b/gpu26/kcarry $b/gpu26/jit
PY=$b/torchvenv/bin/python SYSTEMD_DEBS=$b/carry/systemd JIT_TAR=$b/gpu26/jit/jit-sm90a.tar.xz \
  KERNEL_TGZ=$b/gpu26/kcarry/sgl_kernel_sm90.tgz HOST_SH=$S/gpu-systemd/host.sh \
  bash results/h200/sglang/prepare_carry.sh "$dest"
