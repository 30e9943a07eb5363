#!/bin/bash
# runner's default `free: sglang` job (jobs/k26_marlin.yaml, staged, no prepare step) against a REAL SGLang 0.5.21
# and, from the same carry, 0.5.17, each as the unit of the confined systemd, under a saturating load (load.py: 4
# clients looping /generate of 1,500 tokens, no think time, a 1-token prober every 0.25 s); per job what the
# clients saw (load.py report: complete / truncated / failed, the window) and runner's own report, under $OUT.
#
# HERE (no GPU), once, from this repo's root (~1 min; the lead's carry build/sglang-real/dev from make_carry.sh,
# 53 MB, plus the overlay, 9.6 MB: 63 MB <= 64 MiB):
#     bash results/h200/sglang/run_0521.sh overlay          # writes build/sglang-0521/sglang-0.5.21-overlay.tar.xz
# THE DEVICE CALLS (carry ["build/sglang-real/dev", "build/sglang-0521"], timeout_s 600; expect ~450 s each:
# server start 65-105 s, two staged jobs ~120 s each, collection):
#     SGLANG_OVERLAY=$PWD/build/sglang-0521/sglang-0.5.21-overlay.tar.xz DEV=$PWD/build/sglang-real/dev LOAD=1 THINK_S=0 PREPARE=0 SEQUENCE="sglang+staged sglang+staged" START_BUDGET_S=330 POLL_S=560 bash results/h200/sglang/run_on_device.sh start
#     DEV=$PWD/build/sglang-real/dev LOAD=1 THINK_S=0 PREPARE=0 DRAIN_TIMEOUT=30 SEQUENCE="sglang+staged" START_BUDGET_S=200 POLL_S=500 bash results/h200/sglang/run_on_device.sh start
# (a call cut at its limit: `POLL_S=300 bash results/h200/sglang/run_on_device.sh poll` on the same warm machine.)
# Expected: 0.5.21 (pause_mode null = retract): SUCCEEDED, every load request complete (0 truncated, 0 failed),
# window (not_serving_s) <= payload_s + 3 s, `runner status` "clients (retract): N in flight at the pause: N held,
# 0 aborted, 0 truncated, 0 refused"; 0.5.17 (drain): FAILED at the 30 s drain bound, nothing released, 0 lost.
# If the 0.5.21 server does not start, sglang.log in jobs.tgz has why (a first start without the Python TreeCore
# crashed on `rust_tree_core/adapter.py: insert value must be an int64 tensor`; run_on_device.sh sets it).
set -eu
case ${1:-} in
  overlay)
    out=build/sglang-0521; mkdir -p $out/wheel
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_34_x86_64 sglang==0.5.21 -d $out/wheel
    rm -rf $out/unpacked && mkdir -p $out/unpacked && python3 -m zipfile -e $out/wheel/sglang-0.5.21-*.whl $out/unpacked
    # the Rust front ends (server, gRPC, multimodal): unused by `python3 -m sglang.launch_server`, 20 MB
    find $out/unpacked/sglang/srt/rust_extensions -name '*.so' \( -path '*_server*' -o -path '*_grpc*' \
      -o -path '*_multimodal*' \) -delete 2>/dev/null || true
    tar -C $out/unpacked -cf - sglang | xz -T0 -9 > $out/sglang-0.5.21-overlay.tar.xz
    rm -rf $out/unpacked $out/wheel
    du -sh $out build/sglang-real/dev ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
