#!/bin/bash
# run4 (issue 15): the window schedules side by side on one H200, warm JIT cache (the modules run3 built,
# carried as .jitcache/jit-sm90a.tar.xz), bare kernel runtime, K2.6 full scale, graph replay.
# Every step detached (setsid nohup) so steps outlive a device call; B/steps.txt gets each exit code and wall time.
set -u
B=${B:-/tmp/bench}
W=/tmp/jit
mkdir -p "$B" "$W/tvm-ffi" "$W/sglang"
[ -f "$W/.extracted" ] || { tar xJf .jitcache/jit-sm90a.tar.xz -C "$W/tvm-ffi" && touch "$W/.extracted"; }
rm -rf "$B/payload" && cp -r remote_payload "$B/payload"
export PYTHONUNBUFFERED=1
K26="--experts 384 --hidden 7168 --intermediate 2048 --topk 8 --group-size 32 --batch-sizes 1,2,4,8,16,32,64,128,256,512"

step() {   # step NAME ARGS...
  local name=$1; shift
  local began=$SECONDS
  PYTHONPATH=/tmp/site TVM_FFI_CACHE_DIR=$W/tvm-ffi SGLANG_JIT_CACHE_DIR=$W/sglang \
    python3 "$B/payload/bench_marlin_moe.py" $K26 --backend sglang-kernels "$@" --out "$B/$name.json" > "$B/$name.log" 2>&1
  echo "$name rc=$? wall_s=$((SECONDS - began)) args: $*" >> "$B/steps.txt"
  touch "$B/done.$name"
}
# Interleaved so that machine drift over the session spreads over the arms, not onto one of them.
for s in ${STEPS:-asc1 busy1 il1 cool1 asc2 busy2 il2 cool2 il3 cool3}; do
  case $s in
    asc*)  step $s --order ascending ;;                                   # the old order
    busy*) step $s --order random --settle busy --settle-ms 200 ;;        # run3's recommendation
    il*)   step $s --order interleave --settle busy --settle-ms 200 ;;    # light/heavy in turn, same every rep
    cool*) step $s --order interleave --settle cool --settle-ms 200 --cool-c 2 --cool-max-ms 4000 ;;
  esac
done
touch "$B/DONE"
