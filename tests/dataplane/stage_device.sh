#!/bin/bash
# Stages the data-plane GPU run (issue 10) into .device/dataplane/
# (git-ignored; its own subfolder so that other staged runs in .device/ are
# left alone): binaries plus the non-glibc shared libraries they need, the
# Python attached-mode binding (libstatecache_dataplane.so + the statecache
# package) for torch_attached_check.py, all packed into one
# .device/dataplane/bundle.tar.xz (uncompressed the folder is ~77 MB, over
# the 64 MiB carry limit: every CUDA binary holds the kernels' fatbin;
# compressed ~31 MB). device_run.sh unpacks it to /tmp/sc_dataplane.
#   tests/dataplane/stage_device.sh        # builds, then copies and packs
# Then, on the device (one run call, carry [".device/dataplane"]):
#   bash tests/dataplane/device_run.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
D=.device/dataplane
S=.device/dataplane.staging   # unpacked tree (also ignored; not carried)
targets=(//kernels/cuda:cuda_backend_test //kernels/cuda_ipc:ipc_test
         //tests/dataplane:cuda_queue_test //tests/dataplane:torch_check_ops
         //server/dataplane/bench:dataplane_bench //server:statecached
         //client/python:libstatecache_dataplane.so
         //kernels/cuda:stream_ops_cuda_test //kernels/bench:decode_bench)
bazel build "${targets[@]}"
rm -rf "$S" "$D"
mkdir -p "$S/lib" "$S/python/statecache" "$D"
bin_dir="$(bazel info bazel-bin 2>/dev/null)"
source tests/stage_deps.sh
for bin in kernels/cuda/cuda_backend_test kernels/cuda_ipc/ipc_test \
           tests/dataplane/cuda_queue_test tests/dataplane/torch_check_ops \
           server/dataplane/bench/dataplane_bench server/statecached \
           kernels/cuda/stream_ops_cuda_test kernels/bench/decode_bench; do
  stage_binary "$bin_dir/$bin" "$S" "$S/lib"
done
# The Python binding: the library (next to its dependencies) and the
# package's sources (the gRPC stubs are not needed by attached mode).
stage_binary "$bin_dir/client/python/libstatecache_dataplane.so" "$S/lib" "$S/lib"
cp client/python/statecache/*.py "$S/python/statecache/"
# What was staged (commit, uncommitted files in the build, time).
{ git log -1 --format='%H %s'; git status --short --untracked-files=no; date -u; } > "$S/STAGED"
cp "$S/STAGED" "$D/STAGED"
ls -la "$S" "$S/lib/libstatecache_dataplane.so"
echo "unpacked $(du -sb "$S" | cut -f1) bytes"
tar -C "$S" -cf - . | xz -T0 -6 > "$D/bundle.tar.xz"
bytes=$(du -sb "$D" | cut -f1)
echo "staged $bytes bytes in $D (carry limit 67108864)"
test "$bytes" -lt 67108864
