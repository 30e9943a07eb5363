#!/bin/bash
# The commands a new user types first, each with its output, on this machine (host.address: local,
# the embedded default) plus a fake hung sshd on loopback (accepts TCP, never sends a banner).
# Usage: bash bench/cli_transcript.sh > transcript.md   (takes ~1 minute)
set -u
cd "$(dirname "$0")/.."
W=$(mktemp -d); export RUNNER_STATE_DIR=$W/state
trap 'kill $HUNG 2>/dev/null; rm -rf "$W"' EXIT
R="python -m runner"
sed "s/seconds: 20/seconds: 3/; s/max_runtime: 5m/max_runtime: 5m, queue_timeout: 10m/" jobs/demo.yaml > "$W/demo.yaml"
sed "s/address: local/address: local, root: $(echo "$W" | sed 's/\//\\\//g')\/root/" -i "$W/demo.yaml"
show() { echo; echo "\$ ${*}"; echo '```'; "$@" 2>&1 | cut -c1-220 | tail -${TAILN:-15}; echo "[exit ${PIPESTATUS[0]}]"; echo '```'; }
id_of() { $R submit "$@" 2>/dev/null | head -1; }

echo "## 1. results --plot of the demo payload"
A=$(id_of "$W/demo.yaml"); $R wait "$A" --timeout 60 >/dev/null 2>&1
show $R results "$A" --plot "$W/demo.png"; show ls -la "$W/demo.png"
echo "## 2. a typo inside payload.args, before any host is contacted"
show $R submit "$W/demo.yaml" --set payload.args.secnds=5
echo "## 3. status exits by state"
F=$(id_of "$W/demo.yaml" --set payload.args.fail=true); $R wait "$F" --timeout 60 >/dev/null 2>&1
show $R status "$F"; show $R status "$A"
echo "## 4. progress: status and watch of a running job"
P=$(id_of "$W/demo.yaml" --set payload.args.seconds=8); sleep 3
show $R status "$P"; TAILN=6 show $R watch "$P" --max-wait 2
echo "## 5. a hung sshd (loopback port that never sends a banner)"
python3 -c "import socket,time; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); print(s.getsockname()[1], flush=True); c=[s.accept() for _ in range(9)]; time.sleep(600)" > "$W/port" & HUNG=$!
sleep 1; PORT=$(head -1 "$W/port")
sed "s/address: local.*}/address: 127.0.0.1, port: $PORT, connect_timeout: 3}/" "$W/demo.yaml" > "$W/hung.yaml"
show $R submit "$W/hung.yaml"
echo "## 6. the same --job-id with a different spec"
show $R submit "$W/demo.yaml" --job-id "$A" --set payload.args.seconds=4
show $R submit "$W/demo.yaml" --job-id "$A"
echo "## 7. results of a job without a result; a second cancel"
show $R results "$F"; show $R cancel "$A"
echo "## 8. --json errors"
show $R status nope --json
echo "## 9. --dry-run, --follow, --queue's bound"
show $R submit "$W/demo.yaml" --dry-run --queue-timeout 30m
TAILN=4 show $R submit "$W/demo.yaml" --follow --max-wait 1
echo "## 10. help: one exit table, described options, list header"
TAILN=40 show $R restore-service --help; TAILN=8 show $R list
$R wait "$P" --timeout 30 >/dev/null 2>&1
