#!/bin/bash
# Inside host.sh's confined systemd (run_on_device.sh starts it): the real SGLang server as the unit
# sglang.service, then the motivating job (jobs/k26_marlin.yaml for host `local`, its prepare step while the
# unit serves) once per entry of SEQUENCE (free: stop or sglang; `+staged`: payload.staged=true, else false),
# one after the other, while results/h200/engine/sampler.py records /health_generate, nvidia-smi memory and the
# unit's MainPID. A new job starts only while less than START_BUDGET_S has passed. summarize.py writes
# $D/out/results.{json,md}; $D/out/DONE at the end.
# With LOAD=1, load.py's 4 clients (/generate of 1,500 tokens, looping) and its 0.25 s prober run from the
# server's start to the end (the sampler then polls /get_model_info, which generates nothing, instead of
# /health_generate), and each job's window is reported from the clients' log (load.py report). More entries:
# abort (free: sglang, pause_mode abort), fallback (the default drain with drain_fallback abort), killdrain / killwindow (the default, with the job's supervisor and
# guard SIGKILLed while it drains / while its payload runs). PREPARE=0 leaves the prepare step out (the JIT
# cache is carried warm); DRAIN_TIMEOUT sets service.drain_timeout (FALLBACK_DRAIN_TIMEOUT: a fallback entry's); THINK_S each client's pause between requests.
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
probe_url=$API/health_generate; [ "${LOAD:-0}" = 1 ] && probe_url=$API/get_model_info
python3 results/h200/engine/sampler.py $O/samples.jsonl $probe_url sglang.service &
sampler=$!
if [ "${LOAD:-0}" = 1 ]; then
  python3 results/h200/sglang/load.py run $O/load.jsonl $API 4 1500 ${THINK_S:-0} & loader=$!
  say "load: 4 clients x /generate 1500 tokens, think ${THINK_S:-0} s, prober every 0.25 s (pid $loader)"
fi
sleep 3
kill_when() {  # SIGKILL the job's supervisor and guard once its host status.json satisfies the python test $2
  local id=$1 test=$2 end=$((SECONDS + 300))
  while [ $SECONDS -lt $end ]; do
    if python3 -c "import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if ($test) else 1)" \
        $D/root/jobs/$id/status.json 2>/dev/null; then
      local sup grd; read -r sup grd < <(python3 -c "import json,sys; s=json.load(open(sys.argv[1]))
print((s.get('supervisor') or {}).get('pid'), (s.get('guard') or {}).get('pid'))" $D/root/jobs/$id/status.json)
      kill -KILL $sup $grd; say "$id: SIGKILLed supervisor $sup + guard $grd at $(date +%s.%N | cut -c1-14) ($(python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(s.get('state'), (s.get('service') or {}).get('released'))" $D/root/jobs/$id/status.json | head -c 300))"
      return 0
    fi
    sleep 0.05
  done; say "$id: the kill condition never held"; }
n=0
for free in $SEQUENCE; do
  if [ $n -gt 0 ] && [ $((SECONDS - t0)) -gt $START_BUDGET_S ]; then say "budget: not starting more jobs"; break; fi
  staged=false; case $free in *+staged) staged=true; free=${free%+staged} ;; esac
  id=j$n-$free; [ $staged = true ] && id=$id-staged; n=$((n + 1))
  kill=""; case $free in killdrain|killwindow) kill=$free; free=sglang ;; esac
  extra=(); [ $free = stop ] || extra=(--set service.api_url=$API)
  drains=1  # every free: sglang job drains but abort's
  [ $free = abort ] && { free=sglang; drains=0; extra+=(--set service.pause_mode=abort); }
  dt=${DRAIN_TIMEOUT:-}
  [ $free = fallback ] && { free=sglang; dt=${FALLBACK_DRAIN_TIMEOUT:-$dt}; extra+=(--set service.drain_fallback=abort); }
  [ $free = sglang ] && [ $drains = 1 ] && [ -n "$dt" ] && extra+=(--set service.drain_timeout=$dt)
  [ "${PREPARE:-1}" = 0 ] && extra+=(--set payload.prepare_args=null)
  pid_before=$(systemctl show -p MainPID --value sglang.service)
  say "submit $id (MainPID $pid_before)"
  python3 -m runner submit jobs/k26_marlin.yaml --json --job-id $id \
    --set host.address=local --set host.root=$D/root \
    --set service.unit=sglang.service --set service.health_url=$API/health --set service.health_timeout=330 \
    --set service.free=$free --set payload.staged=$staged \
    --set payload.python=python3 --set payload.env.PYTHONPATH=/tmp/sgsite \
    --set payload.env.TVM_FFI_CACHE_DIR=/tmp/jit/tvm-ffi --set payload.env.SGLANG_JIT_CACHE_DIR=/tmp/jit/sglang \
    --set 'payload.prepare_args={prepare_only: true}' ${BATCH_SIZES:+--set payload.args.batch_sizes=$BATCH_SIZES} \
    "${extra[@]}" > $O/jobs/$id.submit.json 2> $O/jobs/$id.submit.err
  rc=$?; say "submit rc=$rc $(head -c 300 $O/jobs/$id.submit.err)"
  [ $rc -eq 0 ] || continue
  case $kill in
    killdrain) kill_when $id "(s.get('state') == 'STOPPING_SERVICE' and ((s.get('service') or {}).get('released') or {}).get('drain') and not s['service']['released']['drain'].get('outcome')) or s.get('state') in ('DRAINING', 'RUNNING', 'FAILED')" ;;
    killwindow) kill_when $id "s.get('state') == 'RUNNING' and (s.get('payload') or {}).get('pid')" ;;
  esac
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
  python3 -m runner status $id > $O/jobs/$id.status.txt 2>&1
  python3 -m runner results $id > $O/jobs/$id.results.txt 2>&1; echo "rc=$?" >> $O/jobs/$id.results.txt
  cp $D/root/jobs/$id/status.json $O/jobs/$id.host-status.json 2>/dev/null
  cp $D/root/jobs/$id/events.jsonl $O/jobs/$id.events.jsonl 2>/dev/null
  cp $D/root/jobs/$id/output.log $O/jobs/$id.output.log 2>/dev/null
  cp $D/root/jobs/$id/result.json $O/jobs/$id.host-result.json 2>/dev/null
  [ "${LOAD:-0}" = 1 ] && { sleep 2; python3 results/h200/sglang/load.py report $O/load.jsonl $D/root/jobs/$id/status.json \
    > $O/jobs/$id.clients.json 2>&1; say "$id clients: $(head -c 700 $O/jobs/$id.clients.json)"; }
  python3 results/h200/engine/summarize.py $O > $O/summarize.log 2>&1
  sleep 3
done
[ "${LOAD:-0}" = 1 ] && { kill $loader; wait $loader 2>/dev/null; }
kill $sampler; wait $sampler 2>/dev/null
python3 results/h200/engine/summarize.py $O > $O/summarize.log 2>&1
say "done after $((SECONDS - t0)) s"
touch $O/DONE
