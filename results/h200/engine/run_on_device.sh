#!/bin/bash
# On the GPU machine (device tool), from a checkout of this repo: lay out the sglang kernel runtime (/tmp/site),
# torch_memory_saver (/tmp/tms), the confined systemd (host.sh) with gpu_engine_server.py as the unit
# gpu-engine.service (--enable-memory-saver --enable-weights-cpu-backup), and start measure.sh DETACHED inside
# it; then poll until it is done or POLL_S passed and copy what is there to $OUT. `poll` only polls/collects
# (a later call on the same warm machine). Inputs (folders, see README.md): CARRY (sglang/ from
# prepare-sglang-carry.sh without its sgl_kernel tgz, systemd/ debs from gpu-systemd/prepare.sh, tms/ the
# torch_memory_saver 0.0.10 wheel), KCARRY (sgl_kernel_sm90.tgz), GPU_SYSTEMD (host.sh's folder).
#   bash results/h200/engine/run_on_device.sh start|poll
set -u
mode=${1:-start}
D=/tmp/gpu26; POLL_S=${POLL_S:-540}
here=$(pwd)
CARRY=${CARRY:-$here/../../carry}; KCARRY=${KCARRY:-$here/../kcarry}; GPU_SYSTEMD=${GPU_SYSTEMD:-$here/../gpu-systemd}
JIT=${JIT:-$here/../jit/jit-sm90a.tar.xz}  # prebuild-sglang-jit-sm90a.sh's JIT cache, when there: no cold compile
t0=$SECONDS
if [ $mode = start ]; then
  [ -e $D/host.pid ] && kill -0 "$(cat $D/host.pid)" 2>/dev/null && { echo "already running"; exit 1; }
  rm -rf $D; mkdir -p $D/out $D/units $D/.carry
  cp -a "$here" $D/repo && cp -a "$GPU_SYSTEMD" $D/gpu-systemd || exit 1
  cp -a "$CARRY"/sglang/. $D/.carry/ && cp "$KCARRY"/sgl_kernel_sm90.tgz $D/.carry/ || exit 1
  (cd $D && bash repo/results/h200/setup_device.sh) || { echo "sglang site setup failed"; exit 1; }
  [ -e "$JIT" ] && mkdir -p /tmp/jit/tvm-ffi && tar xJf "$JIT" -C /tmp/jit/tvm-ffi && echo "JIT cache laid out from $JIT"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tms "$CARRY"/tms/*.whl || exit 1
  py=$(command -v python3)
  printf '%s\n' "[Unit]" "Description=engine-like CUDA server (SGLang memory routes)" "[Service]" \
    "Environment=PYTHONPATH=/tmp/tms" \
    "ExecStart=$py $D/repo/results/h200/engine/gpu_engine_server.py --port 30000 --weights-gib 15 --leave-mib 4096 --enable-memory-saver --enable-weights-cpu-backup" \
    "StandardOutput=append:$D/out/engine.log" "StandardError=append:$D/out/engine.log" "TimeoutStopSec=60" \
    > $D/units/gpu-engine.service
  echo "setup $((SECONDS - t0)) s; nvidia-smi: $(nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader)"
  HOSTDIR=$D/host setsid nohup bash $D/gpu-systemd/host.sh "$CARRY"/systemd $D/units \
    "D=$D SEQUENCE='${SEQUENCE:-}' START_BUDGET_S=${START_BUDGET_S:-880} BATCH_SIZES='${BATCH_SIZES:-}' JOB='${JOB:-}' EXTRA='${EXTRA:-}' bash $D/repo/results/h200/engine/measure.sh" \
    > $D/host.out 2>&1 < /dev/null &
  echo $! > $D/host.pid
fi
collect() {  # what is there to $OUT: at the end, and after each progress line (a call cut at its limit keeps these)
  [ -n "${OUT:-}" ] || return 0
  for f in results.json results.md progress.log; do [ -e $D/out/$f ] && cp $D/out/$f "$OUT/"; done
  [ -e $D/out/samples.jsonl ] && gzip -c $D/out/samples.jsonl > "$OUT/samples.jsonl.gz"
  tar czf "$OUT/jobs.tgz" -C $D/out jobs engine.log nvidia-smi-idle.txt summarize.log 2>/dev/null
  tar czf "$OUT/host-logs.tgz" -C $D host.out host 2>/dev/null
}
seen=0
while [ $((SECONDS - t0)) -lt $POLL_S ]; do
  [ -e $D/out/DONE ] && break
  kill -0 "$(cat $D/host.pid)" 2>/dev/null || { echo "host.sh ended without DONE"; break; }
  n=$(wc -l < $D/out/progress.log 2>/dev/null || echo 0)
  [ "$n" -gt $seen ] && { sed -n "$((seen + 1)),${n}p" $D/out/progress.log; seen=$n; collect; }
  sleep 5
done
[ -e $D/out/progress.log ] && sed -n "$((seen + 1)),\$p" $D/out/progress.log
if [ -e $D/out/DONE ] && [ -e $D/host/cgroup ]; then echo 1 > "$(cat $D/host/cgroup)/cgroup.kill"; fi
[ -e $D/out/DONE ] || python3 $D/repo/results/h200/engine/summarize.py $D/out > $D/out/summarize.log 2>&1  # the jobs done so far
collect
echo "done=$([ -e $D/out/DONE ] && echo yes || echo no) after $((SECONDS - t0)) s"
