#!/bin/bash
# Runs on the device machine from the repository root, after
# kernels/cuda/stage_stepquant_device.sh here (carry .device/stepquant):
#   .device/stepquant/run_stepquant_device.sh [test] [bench]   (default: both)
# test: stepquant_cuda_test (GPU vs CPU bytes, fast vs one-CTA-per-head
# kernel); bench: stepquant_bench for B in 1..512, GDN and KDA (fp32, damp,
# stepquant-6/-4 fast kernel variants h2 (default), c2, c3, stepquant-4 on the
# one-CTA-per-head kernel). Logs: $OUT (or
# /tmp/sq_out)/stepquant_test.log and stepquant_bench.log. About 2-3 minutes.
set -o pipefail
OUT=${OUT:-/tmp/sq_out}
mkdir -p "$OUT"
dir=.device/stepquant
export LD_LIBRARY_PATH=$PWD/$dir/lib
steps=${*:-test bench}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,memory.total --format=csv | tee "$OUT/env.txt"
# Smoke test first: one fast-kernel case with a short limit, so a hang (an
# mbarrier that never completes) costs 40 s instead of the whole run.
timeout 40 "$dir/stepquant_cuda_test" --gtest_brief=1 \
  --gtest_filter='Paths/StepFastDecodeBatchTest.MatchesCpuAndSlowKernel/KdaStep4Bf16C2' 2>&1 | tail -5
rc=${PIPESTATUS[0]}
if [ "$rc" = 124 ]; then echo "smoke test timed out: fast kernel hangs; stopping"; exit 1; fi
for s in $steps; do
  case $s in
    test)
      timeout 120 "$dir/stepquant_cuda_test" --gtest_brief=1 2>&1 | tee "$OUT/stepquant_test.log" | \
        grep -v "^\[ *OK" | tail -60
      echo "test exit: $?";;
    bench)
      timeout 150 "$dir/stepquant_bench" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/stepquant_bench.log"
      echo "bench exit: $?";;
  esac
done
