#!/bin/bash
# Runs on the device machine from the repository root, after
# kernels/cuda/stage_stepquant_device.sh here (carry .device/stepquant):
#   .device/stepquant/run_stepquant_device.sh [test] [bench]   (default: both)
# test: stepquant_cuda_test (the tiled decode kernel vs the tile reference,
# 0 differing bytes; the CPU-order kernels vs the CPU backend and the
# one-CTA-per-head kernel; the c2 / c3 builds' batch cases are left out:
# unchanged since they passed on the H200); bench: stepquant_bench for B in
# 1..512, GDN and KDA (fp32, damp, stepquant-6/-4 on the default tiled kernel
# and on the CPU-order h2 build). Logs: $OUT (or /tmp/sq_out)/stepquant_test.log
# and stepquant_bench.log. At most 40 + 100 + 90 s (about 2-3 minutes).
set -o pipefail
OUT=${OUT:-/tmp/sq_out}
mkdir -p "$OUT"
dir=.device/stepquant
export LD_LIBRARY_PATH=$PWD/$dir/lib
steps=${*:-test bench}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,memory.total --format=csv | tee "$OUT/env.txt"
# Smoke test first: one tiled-kernel case with a short limit, so a hang (an
# mbarrier or named barrier that never completes) costs 40 s instead of the
# whole run (a failure is printed; the full test still runs).
timeout 40 "$dir/stepquant_cuda_test" --gtest_brief=1 \
  --gtest_filter='Tile/StepTileDecodeTest.MatchesTileReference/KdaStep4Bf16AllWidths' 2>&1 | tail -8
rc=${PIPESTATUS[0]}
if [ "$rc" = 124 ]; then echo "smoke test timed out: the tiled kernel hangs; stopping"; exit 1; fi
for s in $steps; do
  case $s in
    test)
      timeout 100 "$dir/stepquant_cuda_test" --gtest_brief=1 \
        --gtest_filter='-*StepFastDecodeBatchTest*C2:*StepFastDecodeBatchTest*C3' 2>&1 | \
        tee "$OUT/stepquant_test.log" | grep -v "^\[ *OK" | tail -70
      echo "test exit: ${PIPESTATUS[0]}";;
    bench)
      timeout 90 "$dir/stepquant_bench" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/stepquant_bench.log"
      echo "bench exit: ${PIPESTATUS[0]}";;
  esac
done
