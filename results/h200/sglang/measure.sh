#!/bin/bash
# Inside host.sh's confined systemd (run_on_device.sh starts it): the real SGLang server as the unit
# sglang.service, then the motivating job (jobs/k26_marlin.yaml for host `local`, its prepare step while the
# unit serves) once per entry of SEQUENCE (free: stop or sglang; `+staged`: payload.staged=true, else false),
# one after the other, while results/h200/engine/sampler.py records /health_generate, nvidia-smi memory and the
# unit's MainPID. A new job starts only while less than START_BUDGET_S has passed. summarize.py writes
# $D/out/results.{json,md}; $D/out/DONE at the end.
set -u
D=${D:-/tmp/sgr}; cd $D/repo
SEQUENCE=${SEQUENCE:-"sglang stop sglang+staged"}
BATCH_SIZES=${BATCH_SIZES:-}
START_BUDGET_S=${START_BUDGET_S:-300}
export PYTHONPATH=/tmp/rsite:/tmp/sgsite:$D/repo RUNNER_STATE_DIR=$D/state
O=$D/out; mkdir -p $O/jobs
API=http://127.0.0.1:30000
say() { echo "$(date -u +%T) $*" | tee -a $O/progress.log; }
code() { python3 -c "import urllib.request as u,sys
try: print(u.build_opener(u.ProxyHandler({})).open(sys.argv[1], timeout=30).status)
except Exception as e: print(getattr(e, 'code', 0))" "$1"; }
wait_generate() {  # until /health_generate answers 200 (SGLang's own wait inside it is >= 1 s), at most $1 s
  local end=$((SECONDS + $1))
  while [ $SECONDS -lt $end ]; do
    [ "$(code $API/health_generate)" = 200 ] && return 0
    systemctl is-active -q sglang.service || { say "sglang.service is $(systemctl is-active sglang.service)"; return 1; }
    sleep 0.5
  done; return 1; }
t0=$SECONDS
nvidia-smi --query-gpu=index,name,memory.total,memory.used,memory.free --format=csv,noheader > $O/nvidia-smi-idle.txt
systemctl start sglang.service
wait_generate 330 || { say "sglang not healthy after $((SECONDS - t0)) s"; tail -60 $O/sglang.log >> $O/progress.log
  systemctl status sglang.service --no-pager >> $O/progress.log 2>&1; touch $O/DONE; exit 1; }
python3 -c "import urllib.request as u; print(u.urlopen('$API/get_server_info').read().decode())" > $O/server_info.json
say "sglang up after $((SECONDS - t0)) s (first /health_generate 200), MainPID $(systemctl show -p MainPID --value sglang.service); server_info: $(python3 -c "import json; d=json.load(open('$O/server_info.json')); print({k: d.get(k) for k in ('version', 'enable_memory_saver', 'enable_weights_cpu_backup', 'mem_fraction_static', 'max_total_num_tokens', 'attention_backend', 'disable_cuda_graph')})")"
say "nvidia-smi used,free: $(nvidia-smi --query-gpu=memory.used,memory.free --format=csv,noheader)"
python3 results/h200/engine/sampler.py $O/samples.jsonl $API/health_generate sglang.service &
sampler=$!
sleep 3
n=0
for free in $SEQUENCE; do
  if [ $n -gt 0 ] && [ $((SECONDS - t0)) -gt $START_BUDGET_S ]; then say "budget: not starting more jobs"; break; fi
  staged=false; case $free in *+staged) staged=true; free=${free%+staged} ;; esac
  id=j$n-$free; [ $staged = true ] && id=$id-staged; n=$((n + 1))
  extra=(); [ $free = stop ] || extra=(--set service.api_url=$API)
  pid_before=$(systemctl show -p MainPID --value sglang.service)
  say "submit $id (MainPID $pid_before)"
  python3 -m runner submit jobs/k26_marlin.yaml --json --job-id $id \
    --set host.address=local --set host.root=$D/root \
    --set service.unit=sglang.service --set service.health_url=$API/health --set service.health_timeout=330 \
    --set service.free=$free "${extra[@]}" --set payload.staged=$staged \
    --set payload.python=python3 --set payload.env.PYTHONPATH=/tmp/sgsite \
    --set payload.env.TVM_FFI_CACHE_DIR=/tmp/jit/tvm-ffi --set payload.env.SGLANG_JIT_CACHE_DIR=/tmp/jit/sglang \
    --set 'payload.prepare_args={prepare_only: true}' ${BATCH_SIZES:+--set payload.args.batch_sizes=$BATCH_SIZES} > $O/jobs/$id.submit.json 2> $O/jobs/$id.submit.err
  rc=$?; say "submit rc=$rc $(head -c 300 $O/jobs/$id.submit.err)"
  [ $rc -eq 0 ] || continue
  while :; do  # the host's own status.json (what `runner status` reads through the host protocol)
    st=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('state'))" $D/root/jobs/$id/status.json 2>/dev/null)
    case "$st" in SUCCEEDED|FAILED|TIMED_OUT|CANCELLED|LOST) break ;; esac
    sleep 1
  done
  pid_after=$(systemctl show -p MainPID --value sglang.service)
  wait_generate 330; ok=$?
  say "$id: $st, MainPID $pid_before -> $pid_after, generate ok=$((1 - ok)) $(python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['service']; print(s.get('downtime'), s.get('released', {}).get('steps') if s.get('released') else '')" $D/root/jobs/$id/status.json 2>&1 | head -c 600)"
  echo "{\"job\": \"$id\", \"free\": \"$free\", \"staged\": $staged, \"pid_before\": $pid_before, \"pid_after\": $pid_after}" > $O/jobs/$id.pids.json
  python3 -m runner status $id --json > $O/jobs/$id.status.json 2> $O/jobs/$id.status.err
  python3 -m runner results $id --json > $O/jobs/$id.result.json 2>$O/jobs/$id.result.err
  cp $D/root/jobs/$id/status.json $O/jobs/$id.host-status.json 2>/dev/null
  cp $D/root/jobs/$id/events.jsonl $O/jobs/$id.events.jsonl 2>/dev/null
  cp $D/root/jobs/$id/output.log $O/jobs/$id.output.log 2>/dev/null
  cp $D/root/jobs/$id/result.json $O/jobs/$id.host-result.json 2>/dev/null
  python3 results/h200/engine/summarize.py $O > $O/summarize.log 2>&1
  sleep 3
done
kill $sampler; wait $sampler 2>/dev/null
python3 results/h200/engine/summarize.py $O > $O/summarize.log 2>&1
say "done after $((SECONDS - t0)) s"
touch $O/DONE
