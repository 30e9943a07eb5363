#!/bin/bash
# Every benchmark run of the H200 verification, in order. Started detached (setsid nohup) so the cold JIT
# compile outlives one device call; each step writes B/NAME.json (result) and B/NAME.log (event lines).
set -u
B=${B:-/tmp/bench}
mkdir -p "$B"
rm -rf "$B/payload" && cp -r remote_payload "$B/payload"     # a later call may replace the working tree
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
export TVM_FFI_CACHE_DIR=/tmp/jit/tvm-ffi SGLANG_JIT_CACHE_DIR=/tmp/jit/sglang
K26="--experts 384 --hidden 7168 --intermediate 2048 --topk 8 --group-size 32 --batch-sizes 1,2,4,8,16,32,64,128,256,512"
SMALL="--experts 16 --hidden 512 --intermediate 256 --topk 4 --group-size 32 --batch-sizes 1,3,16,64"
K26DIMS="--experts 16 --hidden 7168 --intermediate 2048 --topk 8 --group-size 32 --batch-sizes 1,8,64"

step() {
  local name=$1; shift
  local began=$SECONDS
  python3 "$B/payload/bench_marlin_moe.py" "$@" --out "$B/$name.json" > "$B/$name.log" 2>&1
  echo "$name rc=$? wall_s=$((SECONDS - began)) args: $*" >> "$B/steps.txt"
}

for step_name in ${STEPS:-cold warm1 warm2 warm3 check check_corrupt check_k26dims eager repack zipf e128}; do
  case $step_name in
    cold|warm1|warm2|warm3) step $step_name $K26 --backend auto ;;
    check) step check $SMALL --check ;;
    check_corrupt) step check_corrupt $SMALL --check --corrupt-scale-perm ;;
    check_k26dims) step check_k26dims $K26DIMS --check ;;
    eager) step eager $K26 --timing eager ;;
    repack) step repack $K26 --weights repack ;;
    zipf) step zipf $K26 --routing zipf --zipf-skew 1.1 ;;
    e128) step e128 ${K26/--experts 384/--experts 128} ;;
  esac
done
touch "$B/DONE"
