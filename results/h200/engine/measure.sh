#!/bin/bash
# Inside host.sh's confined systemd (run_on_device.sh starts it): the engine-like CUDA server as the unit
# gpu-engine.service, then the motivating job (jobs/k26_marlin.yaml for host `local`, the prepare step compiling
# while the unit serves) once per entry of SEQUENCE (free: stop or sglang), one after the other, while
# sampler.py records /health_generate, nvidia-smi memory and the unit's MainPID. An entry `sglang+staged` (any
# free method + `+staged`) runs the job with payload.staged=true, a plain entry with payload.staged=false (the
# job file stages). A new job starts only while
# less than START_BUDGET_S has passed. Then summarize.py writes $D/out/results.{json,md}; $D/out/DONE at the end.
set -u
D=${D:-/tmp/gpu26}; cd $D/repo
SEQUENCE=${SEQUENCE:-"sglang stop sglang stop sglang stop sglang stop sglang"}
BATCH_SIZES=${BATCH_SIZES:-}  # e.g. "[1,8,64,512]"; empty: the job file's
START_BUDGET_S=${START_BUDGET_S:-880}
JOB=${JOB:-jobs/k26_marlin.yaml}  # e.g. jobs/k26_marlin_sweep.yaml
read -r -a EXTRA <<< "${EXTRA:-}"  # more --set words for every job, e.g. "--set limits.max_downtime=120s"
export PYTHONPATH=/tmp/site:$D/repo RUNNER_STATE_DIR=$D/state
O=$D/out; mkdir -p $O/jobs
API=http://127.0.0.1:30000
say() { echo "$(date -u +%T) $*" | tee -a $O/progress.log; }
code() { python3 -c "import urllib.request as u,sys
try: print(u.build_opener(u.ProxyHandler({})).open(sys.argv[1], timeout=5).status)
except Exception as e: print(getattr(e, 'code', 0))" "$1"; }
wait_generate() {  # until /health_generate answers 200, at most $1 s
  for _ in $(seq 1 $(( $1 * 5 ))); do [ "$(code $API/health_generate)" = 200 ] && return 0; sleep 0.2; done; return 1; }
t0=$SECONDS
nvidia-smi --query-gpu=index,name,memory.total,memory.used,memory.free --format=csv,noheader > $O/nvidia-smi-idle.txt
systemctl start gpu-engine.service
wait_generate 180 || { say "engine not healthy"; tail -30 $O/engine.log >> $O/progress.log
  systemctl status gpu-engine.service --no-pager >> $O/progress.log 2>&1; touch $O/DONE; exit 1; }
say "engine up after $((SECONDS - t0)) s: $(python3 -c "import urllib.request as u; print(u.urlopen('$API/engine_state').read().decode())")"
nvidia-smi --query-gpu=memory.used,memory.free --format=csv,noheader >> $O/progress.log
python3 results/h200/engine/sampler.py $O/samples.jsonl $API/health_generate gpu-engine.service &
sampler=$!
sleep 3
n=0
for free in $SEQUENCE; do
  if [ $n -gt 0 ] && [ $((SECONDS - t0)) -gt $START_BUDGET_S ]; then say "budget: not starting more jobs"; break; fi
  staged=false; case $free in *+staged) staged=true; free=${free%+staged} ;; esac
  id=j$n-$free; [ $staged = true ] && id=$id-staged; n=$((n + 1))
  extra=(); [ $free = stop ] || extra=(--set service.api_url=$API)
  pid_before=$(systemctl show -p MainPID --value gpu-engine.service)
  say "submit $id (MainPID $pid_before)"
  python3 -m runner submit $JOB --json --job-id $id "${EXTRA[@]}" \
    --set host.address=local --set host.root=$D/root \
    --set service.unit=gpu-engine.service --set service.health_url=$API/health --set service.health_timeout=300 \
    --set service.free=$free "${extra[@]}" --set payload.staged=$staged \
    --set payload.python=python3 --set payload.env.PYTHONPATH=/tmp/site \
    --set payload.env.TVM_FFI_CACHE_DIR=/tmp/jit/tvm-ffi --set payload.env.SGLANG_JIT_CACHE_DIR=/tmp/jit/sglang \
    --set 'payload.prepare_args={prepare_only: true}' ${BATCH_SIZES:+--set payload.args.batch_sizes=$BATCH_SIZES} > $O/jobs/$id.submit.json 2> $O/jobs/$id.submit.err
  rc=$?; say "submit rc=$rc $(head -c 300 $O/jobs/$id.submit.err)"
  [ $rc -eq 0 ] || continue
  while :; do  # the host's own status.json (what `runner status` reads through the host protocol)
    st=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('state'))" $D/root/jobs/$id/status.json 2>/dev/null)
    case "$st" in SUCCEEDED|FAILED|TIMED_OUT|CANCELLED|LOST) break ;; esac
    sleep 1
  done
  python3 -m runner status $id --json > $O/jobs/$id.status.json 2> $O/jobs/$id.status.err
  pid_after=$(systemctl show -p MainPID --value gpu-engine.service)
  wait_generate 120; ok=$?
  say "$id: $st, MainPID $pid_before -> $pid_after, generate ok=$((1 - ok))"
  echo "{\"job\": \"$id\", \"free\": \"$free\", \"staged\": $staged, \"pid_before\": $pid_before, \"pid_after\": $pid_after}" > $O/jobs/$id.pids.json
  python3 -m runner results $id --json > $O/jobs/$id.result.json 2>$O/jobs/$id.result.err  # needs tenacity there
  cp $D/root/jobs/$id/status.json $O/jobs/$id.host-status.json 2>/dev/null
  cp $D/root/jobs/$id/events.jsonl $O/jobs/$id.events.jsonl 2>/dev/null
  cp $D/root/jobs/$id/output.log $O/jobs/$id.output.log 2>/dev/null
  cp $D/root/jobs/$id/result.json $O/jobs/$id.host-result.json 2>/dev/null
  sleep 3  # samples of "after" before the next job's prepare step
done
kill $sampler; wait $sampler 2>/dev/null
python3 results/h200/engine/summarize.py $O > $O/summarize.log 2>&1
say "done after $((SECONDS - t0)) s"
touch $O/DONE
