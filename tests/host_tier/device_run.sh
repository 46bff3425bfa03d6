#!/bin/bash
# The issue 31 host-tier GPU run, one call on the device machine from the
# repository root after tests/host_tier/stage_device.sh (carry
# [".device/host_tier"]):
#   (a) host_tier_cuda_test: page-locked chunks; a checkpoint demoted to the
#       host tier and promoted back restores byte for byte (damp:16, fp32);
#   (b) restore_bandwidth_bench --backend=cuda: PEAK lines (raw
#       cudaMemcpyAsync host -> device from pinned memory, 4 / 16 / 64 /
#       256 MiB and each checkpoint's size) and RESTORE lines (Qwen3.6-35B-A3B
#       checkpoints, 30 x 32 x 128 x 128, damp:16 and fp32, restored from the
#       host tier through ops::LookupPrefix + ops::Restore; arena=free and
#       arena=full; ratio = to the best PEAK batched_gbps; result=OK means
#       every restored slot equals its snapshot).
# Logs and summary.txt go to $OUT (or /tmp/sc_out). Expected < 1 minute.
set -o pipefail
OUT=${OUT:-/tmp/sc_out}
mkdir -p "$OUT"
D=$PWD/.device/host_tier
U=/tmp/sc_host_tier
if [ ! -x "$U/restore_bandwidth_bench" ]; then
  rm -rf "$U" && mkdir -p "$U"
  tar -C "$U" -xJf "$D/bundle.tar.xz" || { echo "cannot unpack $D/bundle.tar.xz"; exit 1; }
fi
export LD_LIBRARY_PATH=$U/lib
cat "$U/STAGED" | tee "$OUT/staged.txt"
nvidia-smi --query-gpu=name,pcie.link.gen.current,pcie.link.width.current --format=csv \
  2>&1 | tee -a "$OUT/staged.txt"
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }
timeout 120 $U/host_tier_cuda_test > "$OUT/host_tier_cuda_test.log" 2>&1
summary "host_tier_cuda_test exit=$?  $(grep -E 'PASSED|FAILED|SKIPPED \]' "$OUT/host_tier_cuda_test.log" | tr '\n' ' ')"
timeout 300 $U/restore_bandwidth_bench --backend=cuda "$@" > "$OUT/restore_bandwidth_bench.log" 2>&1
summary "restore_bandwidth_bench exit=$?"
grep -E '^(backend|PEAK|RESTORE) ' "$OUT/restore_bandwidth_bench.log" | tee -a "$OUT/summary.txt"
