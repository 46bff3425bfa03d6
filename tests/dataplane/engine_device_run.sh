#!/bin/bash
# The engine path's GPU run (issue 25), one call on the device machine from
# the repository root after tests/dataplane/stage_device.sh (carry
# [".device/dataplane"]):
#   (a) stream_ops_cuda_test: the StreamOps contract on CUDA (bytes equal to
#       the validated binding for five formats, padding, every kind of bad
#       input recorded with other slots byte-identical, fence);
#   (b) cuda_backend_test (the validated binding; regression);
#   (c) torch_ops_check.py: statecache.torch from a PyTorch worker (CUDA graph
#       capture + replay with new inputs and indices, errors, torch.compile,
#       fence after detach); strided_pool_bench.py: the decode op on a packed
#       vs a page-strided local pool and the vLLM plugin's decode_prep;
#   (d) decode_bench: the op in a CUDA graph beside the raw kernel (OP /
#       OPSTEP / OPCOPY / OPPACK / OPUNPACK / OPPREFILL lines), Qwen3.6
#       head geometry;
#   (e) when .whl/ holds the fla-core wheel (carry ".whl" as well):
#       kernels/bench/fla_bench.py in the same call, so FLA's kernels sit
#       beside the op (FLA_ARGS selects batches / variants).
# Logs and summary.txt go to $OUT (or /tmp/sc_out).
set -o pipefail
OUT=${OUT:-/tmp/sc_out}
mkdir -p "$OUT"
D=$PWD/.device/dataplane
U=/tmp/sc_dataplane
if [ ! -x "$U/statecached" ]; then
  rm -rf "$U" && mkdir -p "$U"
  tar -C "$U" -xJf "$D/bundle.tar.xz" || { echo "cannot unpack $D/bundle.tar.xz"; exit 1; }
fi
export LD_LIBRARY_PATH=$U/lib
cat "$U/STAGED" | tee "$OUT/staged.txt"
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }
timeout 120 $U/stream_ops_cuda_test --gtest_brief=1 > "$OUT/stream_ops_cuda_test.log" 2>&1
summary "stream_ops_cuda_test exit=$?  $(grep -E 'PASSED|FAILED' "$OUT/stream_ops_cuda_test.log" | head -5 | tr '\n' ' ')"
timeout 120 $U/cuda_backend_test --gtest_brief=1 > "$OUT/cuda_backend_test.log" 2>&1
summary "cuda_backend_test exit=$?  $(grep -E 'PASSED|FAILED' "$OUT/cuda_backend_test.log" | head -5 | tr '\n' ' ')"
timeout 240 python3 tests/dataplane/torch_ops_check.py --dir "$U" > "$OUT/torch_ops_check.log" 2>&1
summary "torch_ops_check exit=$?  $(grep -E '^RESULT' "$OUT/torch_ops_check.log")"
PYTHONPATH=$U/python:client/vllm STATECACHE_DATAPLANE_LIB=$U/lib/libstatecache_dataplane.so \
  timeout 120 python3 tests/dataplane/strided_pool_bench.py > "$OUT/strided_pool_bench.log" 2>&1
summary "strided_pool_bench exit=$?"
grep -E '^STRIDED ' "$OUT/strided_pool_bench.log" >> "$OUT/summary.txt"
timeout ${BENCH_S:-200} $U/decode_bench ${BENCH_ARGS:---batches=1,8,32,64,128,256,512 --formats=damp,int8-hadamard,bf16,fp32 --reps=5} \
  > "$OUT/decode_bench.log" 2>&1
summary "decode_bench exit=$?"
grep -E '^(OP|OPSTEP|OPCOPY|OPPACK|OPUNPACK|OPPREFILL|RESULT|COPY_BW) ' "$OUT/decode_bench.log" >> "$OUT/summary.txt"
if ls .whl/fla_core-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/sc_fla .whl/fla_core-*.whl > "$OUT/fla_install.log" 2>&1
  PYTHONPATH=/tmp/sc_fla PYTHONUNBUFFERED=1 timeout ${FLA_S:-200} python3 kernels/bench/fla_bench.py \
    ${FLA_ARGS:-} > "$OUT/fla.log" 2>&1
  summary "fla_bench exit=$?"
  grep -E '^RESULT ' "$OUT/fla.log" | sed 's/^RESULT /FLA /' >> "$OUT/summary.txt"
fi
