#!/bin/bash
# On the GPU machine (device tool), from the repo root the tool sent, with this folder carried: unpack the
# Python packages SGLang 0.5.17's server needs beyond the image (/tmp/sgsite), the JIT cache of the payload's
# Marlin kernels, tenacity/platformdirs for runner (/tmp/rsite); write the unit sglang.service (a real
# `python3 -m sglang.launch_server`, tiny Llama config, dummy weights, --enable-memory-saver); start measure.sh
# DETACHED inside the confined systemd (gpu-systemd/host.sh); poll until it is done or POLL_S passed; copy
# what is there to $OUT.   bash build/sglang-real/dev/run_on_device.sh start|poll
# SGLANG_OVERLAY=FILE: run SGLang 0.5.21 from the same carry (see below; results/h200/sglang/run_0521.sh).
# DEV=FOLDER: the carried folder (prepare_carry.sh's DEST) when this script runs from a repo of its own (then that
# repo's measure.sh and load.py run, not the carried copies). LOAD, PREPARE, DRAIN_TIMEOUT, FALLBACK_DRAIN_TIMEOUT, THINK_S: measure.sh's.
set -u
mode=${1:-start}
here=${DEV:-$(cd "$(dirname "$0")" && pwd)}; repo=$(pwd)
D=/tmp/sgr; POLL_S=${POLL_S:-540}; t0=$SECONDS
if [ $mode = start ]; then
  [ -e $D/host.pid ] && kill -0 "$(cat $D/host.pid)" 2>/dev/null && { echo "already running"; exit 1; }
  rm -rf $D; mkdir -p $D/out $D/units $D/repo
  tar --exclude=./build -cf - . | tar xf - -C $D/repo && cp -a "$here" $D/dev || exit 1
  # SGLANG_OVERLAY=FILE (sglang-0.5.21-overlay.tar.xz: the 0.5.21 wheel's sglang/ without its Rust front ends):
  # the 0.5.17 site with sglang/ replaced, the launch check's dist-info 0.5.21 / kernel 0.4.7, and the Python
  # TreeCore (0.5.21's Rust one crashes the scheduler on this torch); without it, 0.5.17 as carried.
  sg=0.5.17; kernel=0.4.5; [ -n "${SGLANG_OVERLAY:-}" ] && { sg=0.5.21; kernel=0.4.7; }
  if [ ! -f /tmp/sgsite/.done-$sg ]; then
    rm -rf /tmp/sgsite && mkdir -p /tmp/sgsite && xz -T0 -dc $D/dev/site312.tar.xz | tar xf - -C /tmp/sgsite || exit 1
    if [ -n "${SGLANG_OVERLAY:-}" ]; then
      rm -rf /tmp/sgsite/sglang /tmp/sgsite/sglang-*.dist-info /tmp/sgsite/sglang_kernel-*.dist-info
      xz -T0 -dc "$SGLANG_OVERLAY" | tar xf - -C /tmp/sgsite || exit 1
    fi
    touch /tmp/sgsite/.done-$sg
  fi
  for o in $D/dev/overlay-*.tar.xz; do [ -e "$o" ] && tar xJf "$o" -C /tmp/sgsite; done  # files added to the site later
  # sglang checks sglang-kernel's version by its metadata: the carry has 0.4.5's sgl_kernel/ (sm90 part) without it
  for dist in sglang-kernel:sglang_kernel:$kernel:sgl_kernel sglang:sglang:$sg:sglang; do
    IFS=: read -r name dir ver top <<< "$dist"; mkdir -p /tmp/sgsite/$dir-$ver.dist-info
    printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' $name $ver > /tmp/sgsite/$dir-$ver.dist-info/METADATA
    echo $top > /tmp/sgsite/$dir-$ver.dist-info/top_level.txt
  done
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/rsite $D/dev/rwhl/*.whl || exit 1
  mkdir -p /tmp/jit/tvm-ffi /tmp/jit/sglang /tmp/triton-cache && tar xJf $D/dev/jit-sm90a.tar.xz -C /tmp/jit/tvm-ffi
  py=$(command -v python3)
  env_line="${SGLANG_OVERLAY:+SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python }PYTHONPATH=/tmp/sgsite HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TVM_FFI_CACHE_DIR=/tmp/jit/tvm-ffi SGLANG_JIT_CACHE_DIR=/tmp/jit/sglang TRITON_CACHE_DIR=/tmp/triton-cache"
  args="--model-path $D/dev/tiny-llama --load-format dummy --skip-tokenizer-init --enable-memory-saver --host 127.0.0.1 --port 30000 --attention-backend triton --sampling-backend pytorch --mem-fraction-static ${MEM_FRACTION:-0.95} --log-level info ${SGL_EXTRA:-}"
  printf '%s\n' "[Unit]" "Description=SGLang $sg server (tiny Llama config, dummy weights, memory saver)" "[Service]" \
    "Environment=$env_line" "ExecStart=$py -m sglang.launch_server $args" \
    "StandardOutput=append:$D/out/sglang.log" "StandardError=append:$D/out/sglang.log" "TimeoutStopSec=60" \
    > $D/units/sglang.service
  echo "setup $((SECONDS - t0)) s; $(nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader)"
  cat $D/units/sglang.service
  measure=$D/dev/measure.sh; [ -n "${DEV:-}" ] && measure=$D/repo/results/h200/sglang/measure.sh
  HOSTDIR=$D/host setsid nohup bash $D/dev/gpu-systemd/host.sh $D/dev/systemd $D/units \
    "D=$D SEQUENCE='${SEQUENCE:-}' START_BUDGET_S=${START_BUDGET_S:-300} BATCH_SIZES='${BATCH_SIZES:-}' LOAD=${LOAD:-0} PREPARE=${PREPARE:-1} DRAIN_TIMEOUT=${DRAIN_TIMEOUT:-} FALLBACK_DRAIN_TIMEOUT=${FALLBACK_DRAIN_TIMEOUT:-} THINK_S=${THINK_S:-0} bash $measure" \
    > $D/host.out 2>&1 < /dev/null &
  echo $! > $D/host.pid
fi
collect() {  # what is there to $OUT: after each progress line, and at the end (a call cut at its limit keeps these)
  [ -n "${OUT:-}" ] || return 0
  for f in results.json results.md progress.log; do [ -e $D/out/$f ] && cp $D/out/$f "$OUT/"; done
  [ -e $D/out/samples.jsonl ] && gzip -c $D/out/samples.jsonl > "$OUT/samples.jsonl.gz"
  [ -e $D/out/load.jsonl ] && gzip -c $D/out/load.jsonl > "$OUT/load.jsonl.gz"
  tar czf "$OUT/jobs.tgz" -C $D/out jobs sglang.log server_info.json nvidia-smi-idle.txt summarize.log 2>/dev/null
  tar czf "$OUT/host-logs.tgz" -C $D host.out host units 2>/dev/null
}
seen=0
while [ $((SECONDS - t0)) -lt $POLL_S ]; do
  [ -e $D/out/DONE ] && break
  kill -0 "$(cat $D/host.pid)" 2>/dev/null || { echo "host.sh ended without DONE"; break; }
  n=$(wc -l < $D/out/progress.log 2>/dev/null || echo 0)
  [ "$n" -gt $seen ] && { sed -n "$((seen + 1)),${n}p" $D/out/progress.log; seen=$n; collect; }
  sleep 3
done
[ -e $D/out/progress.log ] && sed -n "$((seen + 1)),\$p" $D/out/progress.log
if [ -e $D/out/DONE ] && [ -e $D/host/cgroup ]; then echo 1 > "$(cat $D/host/cgroup)/cgroup.kill"; fi
[ -e $D/out/DONE ] || python3 $D/repo/results/h200/engine/summarize.py $D/out > $D/out/summarize.log 2>&1
collect
echo "--- sglang.log tail"; tail -${LOG_TAIL:-40} $D/out/sglang.log 2>/dev/null | cut -c1-400
echo "done=$([ -e $D/out/DONE ] && echo yes || echo no) after $((SECONDS - t0)) s"
