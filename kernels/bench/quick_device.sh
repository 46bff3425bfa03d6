#!/bin/bash
# One optimization iteration on the device (after kernels/bench/stage_device.sh
# here; carry .device/lib, .device/cuda_backend_test, .device/decode_bench):
# the GPU tests, a decode_bench subset, and optionally an ncu profile.
#
#   BATCHES=1,8,256 FORMATS=damp,fp32 ARCHES=gdn,kda PROFILE="damp" \
#     bash kernels/bench/quick_device.sh
#
# NOTEST=1 skips cuda_backend_test. PROFILE lists formats to profile at B=256
# (GDN): ncu's details page and per-SASS-instruction counters land in $OUT
# (<format>_details.txt, <format>_sass.csv); kernels/bench/ncu_summary.py
# prints the instruction mix and stall reasons, kernels/bench/ncu_lines.py
# maps the counters to source lines (the kernels are built with -lineinfo).
export LD_LIBRARY_PATH=.device/lib
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -z "${NOTEST:-}" ] && .device/cuda_backend_test --gtest_brief=1 2>&1 | tail -4
.device/decode_bench --batches="${BATCHES:-1,8,64,256}" --formats="${FORMATS:-fp32,damp,damp-sr,bf16}" \
  --arches="${ARCHES:-gdn,kda}" > "$OUT/bench.log" 2>&1
grep RESULT "$OUT/bench.log" | sed 's/state_bytes.*//'
for f in ${PROFILE:-}; do
  ncu --clock-control none -k regex:PipelinedDecodeKernel --launch-skip 3 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section SchedulerStats \
    --section SpeedOfLight --section InstructionStats \
    -o "$OUT/$f" .device/decode_bench --batches=256 --formats="$f" --arches=gdn --iters=2 --reps=1 \
    > /dev/null 2>&1
  ncu -i "$OUT/$f.ncu-rep" --page details > "$OUT/${f}_details.txt" 2>&1
  ncu -i "$OUT/$f.ncu-rep" --page source --print-source sass --csv > "$OUT/${f}_sass.csv" 2>&1
  rm -f "$OUT/$f.ncu-rep"
  grep -E "Duration|Executed Instructions  |Issue Slots|DRAM Through" "$OUT/${f}_details.txt"
  python3 kernels/bench/ncu_summary.py "$OUT/${f}_sass.csv" | head -3
done
