#!/bin/bash
# Stages the data-plane GPU run (issue 10) into .device/ (git-ignored), the
# same way as kernels/bench/stage_device.sh: binaries plus the non-glibc
# shared libraries they need. Does not remove what is already there.
#   tests/dataplane/stage_device.sh        # builds, then copies
# Then, on the device (one run call): tests/dataplane/device_run.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
targets=(//kernels/cuda:cuda_backend_test //kernels/cuda_ipc:ipc_test
         //server/dataplane:dataplane_bench //server:statecached)
bazel build "${targets[@]}"
mkdir -p .device/lib
bin_dir="$(bazel info bazel-bin 2>/dev/null)"
for bin in kernels/cuda/cuda_backend_test kernels/cuda_ipc/ipc_test \
           server/dataplane/dataplane_bench server/statecached; do
  cp -Lf "$bin_dir/$bin" .device/
  ldd "$bin_dir/$bin" | awk '/=>/ {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*) ;;
      *) cp -Ln "$lib" .device/lib/ 2>/dev/null || true ;;
    esac
  done
done
ls -la .device
du -sh .device
