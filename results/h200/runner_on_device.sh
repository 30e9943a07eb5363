#!/bin/bash
# The motivating job driven end to end by `runner` itself on the GPU machine, as an agent would drive it:
# submit, then `runner tail -f --max-wait 50` again and again (exit 75 = call again) through the cold JIT
# compile, then status and results. The GPU machine has no sshd and no systemd, so the host is `local`
# (the same host protocol, through subprocess) and the service section is `manager: none`; nvidia-smi,
# the preflight, the GPU checks and CUDA_VISIBLE_DEVICES are the real ones.
set -u
bash results/h200/setup_device.sh >/dev/null
export PYTHONPATH=/tmp/site:$PWD RUNNER_STATE_DIR=/tmp/runner-state
O=${OUT:-/tmp/out}; mkdir -p "$O"
nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,memory.free --format=csv,noheader,nounits > "$O/nvidia-smi.txt"
t0=$SECONDS
python3 -m runner submit jobs/k26_marlin.yaml --json \
  --set host.address=local --set host.root=/tmp/runner-root --set 'service={manager: none}' \
  --set payload.python=python3 --set payload.env.TVM_FFI_CACHE_DIR=/tmp/jit/tvm-ffi \
  --set payload.env.SGLANG_JIT_CACHE_DIR=/tmp/jit/sglang --set 'payload.args.batch_sizes=[1,8,64,512]' \
  > "$O/submit.json" 2> "$O/submit.err"
echo "submit rc=$? wall_s=$((SECONDS - t0))" | tee "$O/calls.txt"
id=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['job_id'])" "$O/submit.json") || { cat "$O/submit.err"; exit 1; }
while :; do
  t=$SECONDS
  python3 -m runner tail "$id" -f --max-wait 50 >> "$O/tail.log" 2>> "$O/tail.err"; rc=$?
  echo "tail rc=$rc wall_s=$((SECONDS - t)) log_bytes=$(stat -c %s "$O/tail.log")" | tee -a "$O/calls.txt"
  [ $rc -eq 75 ] || break
done
python3 -m runner status "$id" --json > "$O/status.json"
python3 -m runner results "$id" > "$O/results.txt"; python3 -m runner results "$id" --json > "$O/result.json"
cmp "$O/tail.log" "/tmp/runner-root/jobs/$id/output.log" && echo "tail output == host output.log" | tee -a "$O/calls.txt"
cat "$O/results.txt"
