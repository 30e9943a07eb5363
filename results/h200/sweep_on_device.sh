#!/bin/bash
# Issue 12 on the H200: jobs/k26_marlin_sweep.yaml (experts {384,128} x routing {uniform,zipf}, four variants in
# one window) driven by `runner` itself on the GPU machine, as an agent would: submit, then `runner tail -f
# --max-wait 50` until it stops answering 75, then status and results. host local, service none (the GPU box has
# no systemd); nvidia-smi, preflight, CUDA_VISIBLE_DEVICES are the real ones. The warm JIT cache (.jitcache) is
# laid out first, as in device_session4.sh. Everything detached (setsid) so it outlives a device call:
#   call 1: setsid nohup bash results/h200/sweep_on_device.sh > /tmp/sweep.out 2>&1 &   call 2..: poll /tmp/sweep/DONE
set -u
bash results/h200/setup_device.sh >/dev/null
W=/tmp/jit O=/tmp/sweep
mkdir -p "$W/tvm-ffi" "$W/sglang" "$O"
[ -f "$W/.extracted" ] || { tar xJf .jitcache/jit-sm90a.tar.xz -C "$W/tvm-ffi" && touch "$W/.extracted"; }
export PYTHONPATH=/tmp/site:$PWD RUNNER_STATE_DIR=/tmp/runner-state
nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,memory.free,temperature.gpu,clocks.sm --format=csv,noheader > "$O/nvidia-smi.txt"
t0=$SECONDS
python3 -m runner submit jobs/k26_marlin_sweep.yaml --json \
  --set host.root=/tmp/runner-root --set payload.python=python3 \
  --set payload.env.TVM_FFI_CACHE_DIR=$W/tvm-ffi --set payload.env.SGLANG_JIT_CACHE_DIR=$W/sglang \
  > "$O/submit.json" 2> "$O/submit.err"
echo "submit rc=$? wall_s=$((SECONDS - t0))" | tee "$O/calls.txt"
id=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['job_id'])" "$O/submit.json") || { cat "$O/submit.err"; touch "$O/DONE"; exit 1; }
echo "$id" > "$O/job_id"
while :; do
  t=$SECONDS
  python3 -m runner tail "$id" -f --max-wait 50 >> "$O/tail.log" 2>> "$O/tail.err"; rc=$?
  echo "tail rc=$rc wall_s=$((SECONDS - t)) log_bytes=$(stat -c %s "$O/tail.log")" >> "$O/calls.txt"
  [ $rc -eq 75 ] || break
done
python3 -m runner status "$id" --json > "$O/status.json"
python3 -m runner results "$id" > "$O/results.txt" 2>&1
cmp "$O/tail.log" "/tmp/runner-root/jobs/$id/output.log" && echo "tail output == host output.log" >> "$O/calls.txt"
tar czf "$O/jobdir.tgz" -C /tmp/runner-root/jobs "$id"
echo "total wall_s=$((SECONDS - t0))" >> "$O/calls.txt"
touch "$O/DONE"
