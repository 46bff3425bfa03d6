#!/bin/bash
# The data-plane GPU run (issue 10), one self-contained call on the device
# machine from the repository root, after tests/dataplane/stage_device.sh:
#   (a) CUDA backend gtests and the two-process CUDA IPC test;
#   (b) dataplane_bench --backend=cuda, four modes at B in {1, 32, 256}, with
#       statecached in separate processes (spawned);
#   (c) the same tool's --verify: every mode's o (attached: worker process on
#       the IPC-mapped pool; buffers: statecached process reading CUDA IPC
#       buffers; inline) bit-identical to the in-process kernel calls, plus a
#       small-geometry two-process run.
# Logs and a summary go to $OUT (or /tmp/sc_out). Worst case 280 s of timeouts;
# expected well under 2 minutes.
set -o pipefail
OUT=${OUT:-/tmp/sc_out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.device/lib
D=.device
# Overrides for a dry run on a CPU machine:
#   BACKEND=cpu BATCHES=2 GEOMETRY=gdn:2:2:4:128:128 tests/dataplane/device_run.sh
BACKEND=${BACKEND:-cuda}
BATCHES=${BATCHES:-1,32,256}
GEOMETRY=${GEOMETRY:-gdn:30:16:32:128:128}
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv 2>&1 | tee "$OUT/env.txt"
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }

# (a)
timeout 100 $D/cuda_backend_test --gtest_brief=1 > "$OUT/cuda_backend_test.log" 2>&1
summary "cuda_backend_test exit=$?  $(grep -E 'PASSED|FAILED' "$OUT/cuda_backend_test.log" | head -3 | tr '\n' ' ')"
timeout 30 $D/ipc_test > "$OUT/ipc_test.log" 2>&1
summary "ipc_test exit=$?  $(grep -E 'PASSED|FAILED|SKIPPED' "$OUT/ipc_test.log" | head -3 | tr '\n' ' ')"

# (c) small geometry first: fast, checks the two-process path before the big run.
timeout 30 $D/dataplane_bench --backend=$BACKEND --server=spawn --statecached=$D/statecached \
  --geometry=gdn:2:2:4:128:128 --batches=4 --steps=2 --warmup=1 > "$OUT/two_process_small.log" 2>&1
summary "two_process_small exit=$?  $(grep -cE 'identical=yes' "$OUT/two_process_small.log") modes identical; $(grep -E 'identical=NO|error=' "$OUT/two_process_small.log" | head -3 | tr '\n' ' ')"

# (b) + (c) Qwen3.6-35B-A3B geometry (default), damp, B = 1, 32, 256.
timeout 120 $D/dataplane_bench --backend=$BACKEND --server=spawn --statecached=$D/statecached \
  --geometry=$GEOMETRY --batches=$BATCHES --steps=${STEPS:-20} --warmup=3 > "$OUT/bench.log" 2>&1
summary "bench exit=$?"
grep -E '^RESULT|^\||^FAILURES' "$OUT/bench.log" | tee -a "$OUT/summary.txt"
