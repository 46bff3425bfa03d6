#!/bin/bash
# Runs on the device machine from the repository root (see stage_device.sh):
#   kernels/bench/run_device.sh [test] [bench] [fla]   (default: all three)
# Logs go to $OUT (or /tmp/sc_out).
set -o pipefail
OUT=${OUT:-/tmp/sc_out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.device/lib
steps=${*:-test bench fla}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,memory.used,memory.total --format=csv | tee "$OUT/env.txt"
for s in $steps; do
  case $s in
    test)
      timeout 300 .device/cuda_backend_test --gtest_brief=1 2>&1 | tee "$OUT/test.log" | tail -60
      echo "test exit: $?";;
    bench)
      timeout 300 .device/decode_bench ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | grep -v "^RESULT\|^SNAPSHOT" ;;
    fla)
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
      PYTHONUNBUFFERED=1 timeout 300 python3 kernels/bench/fla_bench.py ${FLA_ARGS:-} 2>&1 | tee "$OUT/fla.log" | tail -40;;
  esac
done
