#!/bin/bash
# run3 (issues 15 and 16) on one H200: every step detached (setsid nohup), so steps outlive a device call.
# Expects results/h200/setup_device.sh and .sgfull/setup-full.sh already run: /tmp/site (kernel runtime) and
# /tmp/full (full-import packages). The JIT caches start empty: the first step compiles (and times that).
# Each step writes B/NAME.json and B/NAME.log; B/steps.txt gets its exit code, wall time and arguments.
set -u
B=${B:-/tmp/bench}
mkdir -p "$B"
rm -rf "$B/payload" && cp -r remote_payload "$B/payload"     # a later call replaces the working tree
export PYTHONUNBUFFERED=1
K26="--experts 384 --hidden 7168 --intermediate 2048 --topk 8 --group-size 32 --batch-sizes 1,2,4,8,16,32,64,128,256,512"
SMALL="--experts 16 --hidden 512 --intermediate 256 --topk 4 --group-size 32 --batch-sizes 1,3,16,64"
NEW="--order random --settle busy --settle-ms 200"
BARE=/tmp/site                 # kernel runtime only: `auto` ends at sglang-kernels, as in run1/run2
FULL=/tmp/site:/tmp/full       # + sglang's full import: fused_marlin_moe imports

step() {   # step NAME PYTHONPATH JITDIR ARGS...
  local name=$1 path=$2 jit=$3; shift 3
  local began=$SECONDS
  PYTHONPATH=$path TVM_FFI_CACHE_DIR=$jit/tvm-ffi SGLANG_JIT_CACHE_DIR=$jit/sglang \
    python3 "$B/payload/bench_marlin_moe.py" "$@" --out "$B/$name.json" > "$B/$name.log" 2>&1
  echo "$name rc=$? wall_s=$((SECONDS - began)) PYTHONPATH=$path jit=$jit args: $*" >> "$B/steps.txt"
}

W=/tmp/jit
# 1. Both cold compiles at once, each into its own empty cache (nvcc runs on the CPU, one core each of 16;
#    the prepare step touches no weights): the prepare step alone, and a whole run whose first call compiles.
rm -rf $W /tmp/jitcold
step cold_prepare $FULL $W $K26 --backend auto --prepare-only &
step cold_first_call $FULL /tmp/jitcold $K26 --backend auto $NEW &
wait
touch "$B/done.cold"
# 2. The run after the prepare step: every module is found built. Then the timing comparisons, warm.
for s in ${STEPS:-after_prepare asc1 rnd1 busy1 asc2 rnd2 busy2 asc3 rnd3 busy3 fused1 kseq1 fused2 kseq2 fused3 kseq3 check_fused check_fused_corrupt}; do
  case $s in
    after_prepare) step $s $FULL $W $K26 --backend auto $NEW ;;
    asc*)  step $s $BARE $W $K26 --backend sglang-kernels --order ascending ;;
    rnd*)  step $s $BARE $W $K26 --backend sglang-kernels --order random ;;
    busy*) step $s $BARE $W $K26 --backend sglang-kernels $NEW ;;
    fused*) step $s $FULL $W $K26 --backend sglang $NEW ;;
    kseq*) step $s $FULL $W $K26 --backend sglang-kernels $NEW ;;
    check_fused) step $s $FULL $W $SMALL --backend sglang --check ;;
    check_fused_corrupt) step $s $FULL $W $SMALL --backend sglang --check --corrupt-scale-perm ;;
  esac
  touch "$B/done.$s"
done
touch "$B/DONE"
