#!/bin/bash
# The GPU run of statecache.integrations (issue 27), one call on the device
# machine from the repository root after tests/integrations/stage_device.sh
# (carry [".device/integrations", ".whl"]):
#   (a) fla_check.py: FLA gdn-tiny / kda-tiny golden logits, held-out
#       bits/byte and greedy agreement with states in statecache (fp32 vs
#       stock FLA; damp:16 calibrated in the runtime and int8-hadamard vs the
#       C++ reference worker), multi-turn restore, bad input on the CUDA
#       pool, transformers Qwen3-Next on CUDA;
#   (b) decode_step_bench.py: one decode step at Qwen3.6-35B-A3B
#       linear-attention geometry, B = 1 / 64 / 256, stock FP32 vs damp:16;
#   (c) worker: the C++ reference worker's format sweep on the CUDA backend
#       (`worker sweep --backend=cuda`, WORKER_MODELS, WORKER_FORMATS; damp
#       calibrated in memory), the reference figures of (a) on the same GPU.
# Logs and summary.txt go to $OUT (or /tmp/sc_out). ~6-9 min in all.
# PARTS (default "fla bench") picks which of (a), (b) and (c) run, in the
# order worker, fla, bench.
set -o pipefail
OUT=${OUT:-/tmp/sc_out}
mkdir -p "$OUT"
U=/tmp/sc_integrations
if [ ! -x "$U/statecached" ]; then
  rm -rf "$U" && mkdir -p "$U"
  tar -C "$U" -xJf .device/integrations/bundle.tar.xz || { echo "cannot unpack the bundle"; exit 1; }
fi
export LD_LIBRARY_PATH=$U/lib
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/fla_core-0.6.0-*.whl .whl/flash_linear_attention-0.6.0-*.whl \
  && export PYTHONPATH=/tmp/site
cat "$U/STAGED" | tee "$OUT/staged.txt"
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }
SHARED=${SHARED:-$U/shared}
PARTS=${PARTS:-fla bench}
if [[ " $PARTS " == *" worker "* ]]; then
  for m in ${WORKER_MODELS:-gdn-tiny kda-tiny}; do
    STATECACHE_SHARED_DIR=$SHARED timeout ${WORKER_S:-240} $U/worker sweep --backend=cuda \
      --model=$m --formats=${WORKER_FORMATS:-int8-hadamard,damp:16} \
      > "$OUT/worker_$m.log" 2> "$OUT/worker_$m.err"
    summary "worker sweep $m exit=$?"
    grep -E '^(model|\|)' "$OUT/worker_$m.log" >> "$OUT/summary.txt"
  done
fi
if [[ " $PARTS " == *" fla "* ]]; then
PYTHONUNBUFFERED=1 timeout ${FLA_S:-420} python3 tests/integrations/fla_check.py --dir "$U" \
  --shared "$SHARED" ${FLA_ARGS:-} > "$OUT/fla_check.log" 2>&1
summary "fla_check exit=$?  $(grep -E '^RESULT fla_check' "$OUT/fla_check.log")"
grep -E '^(FAIL|RESULT fla )' "$OUT/fla_check.log" >> "$OUT/summary.txt"
fi
[[ " $PARTS " == *" bench "* ]] || exit 0
PYTHONUNBUFFERED=1 timeout ${BENCH_S:-150} python3 tests/integrations/decode_step_bench.py \
  --dir "$U" ${BENCH_ARGS:-} > "$OUT/decode_step_bench.log" 2>&1
summary "decode_step_bench exit=$?"
grep -E '^(FAIL|RESULT)' "$OUT/decode_step_bench.log" >> "$OUT/summary.txt"
