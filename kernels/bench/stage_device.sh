#!/bin/bash
# Copies the GPU test and benchmark binaries plus the non-glibc shared
# libraries they need into .device/ (git-ignored) for the device machine:
#   bazel build //kernels/cuda:cuda_backend_test //kernels/bench:decode_bench
#   kernels/bench/stage_device.sh
# On the device: LD_LIBRARY_PATH=.device/lib .device/cuda_backend_test
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
# Only this script's files: other staging scripts use subfolders of .device/.
rm -rf .device/lib .device/cuda_backend_test .device/decode_bench && mkdir -p .device/lib
# The bazel-bin symlink can point at another output base (sanitizer builds);
# ask this workspace's default server where its outputs are.
bin_dir="$(bazel info bazel-bin 2>/dev/null)"
for bin in "$bin_dir/kernels/cuda/cuda_backend_test" "$bin_dir/kernels/bench/decode_bench"; do
  cp -L "$bin" .device/
  ldd "$bin" | awk '/=>/ {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*) ;;
      *) cp -Ln "$lib" .device/lib/ ;;
    esac
  done
done
cp kernels/bench/*.py .device/ 2>/dev/null || true
du -sh .device
