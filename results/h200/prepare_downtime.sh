#!/bin/bash
# Issue 16, "compile before the stop", through runner's own host side on one H200: two jobs started with
# `supervisor.py start` exactly as the local transport runs it (host.address: local; service manager none,
# so "downtime" is the span a stopped service would be down: RUNNING start -> end), each with an EMPTY JIT
# cache: `noprep` compiles on its first timed call; `prep` has the prepare step (--prepare-only) first.
# Both run at once (nvcc compiles on the CPU; 16 cores). Expects .carry and .sgfull (see setup_device.sh).
set -u
bash results/h200/setup_device.sh >/dev/null && bash .sgfull/setup-full.sh >/dev/null || exit 1
# Both jobs name GPU 0, so the second waits for the first's lock (--queue): run them one after the other,
# or one per call with ONLY=noprep / ONLY=prep.
R=/tmp/rroot; mkdir -m 700 -p $R
A='"--experts","384","--hidden","7168","--intermediate","2048","--topk","8","--group-size","32",'
A=$A'"--batch-sizes","1,2,4,8,16,32,64,128,256,512","--order","random","--settle","busy","--settle-ms","200"'
spec() {  # ID JITDIR PREPARE
  printf '{"name":"%s","job_id":"%s","service":{"manager":"none"},' "$1" "$1"
  printf '"gpu":{"devices":["0"],"required_mib":0,"drain_timeout":120},"payload":{"python":"python3",'
  printf '"script":"bench_marlin_moe.py","args":[%s],"command":null,"env":{"PYTHONPATH":"/tmp/site:/tmp/full",' "$A"
  printf '"TVM_FFI_CACHE_DIR":"%s/tvm-ffi","SGLANG_JIT_CACHE_DIR":"%s/sglang"},"prepare":%s},' "$2" "$2" "$3"
  printf '"limits":{"max_runtime":1500,"grace":30,"prepare_timeout":1500}}'
}
if [ "${ONLY:-noprep}" = noprep ]; then
  rm -rf $R/jobs/noprep /tmp/jitA
  spec noprep /tmp/jitA null | python3 remote_payload/supervisor.py start --job-id noprep --root $R
fi
if [ "${ONLY:-prep}" = prep ]; then
  rm -rf $R/jobs/prep /tmp/jitB
  spec prep /tmp/jitB "[$A,\"--prepare-only\"]" | python3 remote_payload/supervisor.py start --job-id prep --root $R --queue
fi
for _ in $(seq 1 ${POLLS:-280}); do
  python3 remote_payload/supervisor.py status --job-id ${ONLY:-noprep} --job-id ${ONLY:-prep} --root $R > /tmp/st.json
  python3 -c "import json,sys; j=json.load(open('/tmp/st.json'))['jobs']; sys.exit(0 if all(x['state'] in ('SUCCEEDED','FAILED','TIMED_OUT','CANCELLED','LOST') for x in j) else 1)" && break
  sleep 2
done
python3 - "$R" <<'PY'
import json, sys
root = sys.argv[1]
import os
for job in ("noprep", "prep"):
    if not os.path.exists(f"{root}/jobs/{job}/status.json"):
        continue
    st = json.load(open(f"{root}/jobs/{job}/status.json"))
    ev = [json.loads(l) for l in open(f"{root}/jobs/{job}/events.jsonl")]
    running = next(e["t"] for e in ev if e.get("event") == "state" and e.get("state") == "RUNNING")
    prepare = st.get("prepare") or {}
    print(f"{job}: {st['state']} prepare_s={prepare.get('seconds')} exit={st.get('exit_code')} "
          f"downtime_span_s={st['ended_at'] - running:.1f} (RUNNING -> end) total_s={st['ended_at'] - st['created_at']:.1f}")
PY
tar czf "${OUT:-/tmp}/prepare_downtime.tgz" --exclude=reserve -C $R jobs
