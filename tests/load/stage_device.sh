#!/bin/bash
# Stages the issue 33 GPU run (concurrent workers on the CUDA backend) into
# .device/load/ (git-ignored; its own subfolder, other staged runs in
# .device/ are left alone): statecached, statecache_load, update_echo_bench,
# multi_worker_bench, cuda_concurrency_test and cuda_backend_test plus the non-glibc shared
# libraries they need, packed into .device/load/bundle.tar.xz (every CUDA
# binary holds the kernels' sm_90a fatbin). device_run.sh unpacks it to
# /tmp/sc_load.
#   tests/load/stage_device.sh
#   BASE_STATECACHED=/path/to/statecached-of-main tests/load/stage_device.sh   # + a baseline
#   BASE_ECHO_BENCH=/path/to/update_echo_bench-of-main ...   # + its echo bench (before/after)
# Then, on the device (one run call, carry [".device/load"]):
#   bash tests/load/device_run.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
D=.device/load
S=.device/load.staging   # unpacked tree (also ignored; not carried)
targets=(//server:statecached //tests/load:statecache_load //tests/load:update_echo_bench
         //server/dataplane/bench:multi_worker_bench
         //kernels/cuda:cuda_concurrency_test //kernels/cuda:cuda_backend_test)
bazel build --jobs=2 "${targets[@]}"
rm -rf "$S" "$D"
mkdir -p "$S/lib" "$D"
bin_dir="$(bazel info bazel-bin 2>/dev/null)"
source tests/stage_deps.sh
for bin in server/statecached tests/load/statecache_load tests/load/update_echo_bench \
           server/dataplane/bench/multi_worker_bench \
           kernels/cuda/cuda_concurrency_test kernels/cuda/cuda_backend_test; do
  stage_binary "$bin_dir/$bin" "$S" "$S/lib"
done
if [ -n "${BASE_STATECACHED:-}" ]; then stage_binary "$BASE_STATECACHED" "$S" "$S/lib" statecached_base; fi
if [ -n "${BASE_ECHO_BENCH:-}" ]; then stage_binary "$BASE_ECHO_BENCH" "$S" "$S/lib" update_echo_bench_base; fi
cp tests/load/run_mixed.sh "$S/"
{ git log -1 --format='%H %s'; git status --short --untracked-files=no; date -u;
  [ -n "${BASE_STATECACHED:-}" ] && echo "baseline: $BASE_STATECACHED";
  [ -n "${BASE_ECHO_BENCH:-}" ] && echo "baseline echo bench: $BASE_ECHO_BENCH"; } > "$S/STAGED" || true
cp "$S/STAGED" "$D/STAGED"
ls -la "$S"
echo "unpacked $(du -sb "$S" | cut -f1) bytes"
tar -C "$S" -cf - . | xz -T0 -6 > "$D/bundle.tar.xz"
bytes=$(du -sb "$D" | cut -f1)
echo "staged $bytes bytes in $D (carry limit 67108864)"
test "$bytes" -lt 67108864
