#!/bin/bash
# A/B of two decode_bench builds in one device call (how docs/BENCHMARKS.md's
# per-step gains were measured): each repetition runs the baseline, then the
# candidate, so drift hits both alike. decode_bench links the kernels
# statically (only system libraries come from .device/lib), so a copy of an
# older build is a self-contained baseline.
#
#   here:   git stash && bazel build //kernels/bench:decode_bench &&
#           cp bazel-bin/kernels/bench/decode_bench .device/decode_bench_a && git stash pop
#           bazel build //kernels/cuda:cuda_backend_test //kernels/bench:decode_bench
#           kernels/bench/stage_device.sh
#   device: BATCHES=8,256 FORMATS=damp,fp32 bash kernels/bench/ab_device.sh
#           (run tool; carry .device/lib, .device/cuda_backend_test, .device/decode_bench,
#            .device/decode_bench_a)
#
# Env: BATCHES, FORMATS, ARCHES (decode_bench flags), REPS (default 2),
# NOTEST=1 skips the candidate's cuda_backend_test, ENV_A / ENV_B extra
# environment for either side (e.g. ENV_B="STATECACHE_CUDA_STAGES=1").
export LD_LIBRARY_PATH=.device/lib
[ -z "${NOTEST:-}" ] && { echo "== candidate cuda_backend_test"; .device/cuda_backend_test --gtest_brief=1 2>&1 | tail -2; }
args=(--batches="${BATCHES:-8,256}" --formats="${FORMATS:-damp,damp-sr,fp32,bf16}" --arches="${ARCHES:-gdn}")
for r in $(seq "${REPS:-2}"); do
  echo "== baseline (rep $r)"
  env ${ENV_A:-} .device/decode_bench_a "${args[@]}" 2>&1 | grep '^RESULT' | sed 's/ state_bytes.*//'
  echo "== candidate (rep $r)"
  env ${ENV_B:-} .device/decode_bench "${args[@]}" 2>&1 | grep '^RESULT' | sed 's/ state_bytes.*//'
done
