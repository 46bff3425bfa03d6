#!/bin/bash
# Stages the STEPQuant CUDA test (issue 9) into .device/ (git-ignored), the
# same way as tests/dataplane/stage_device.sh: the test binary plus the
# non-glibc shared libraries it needs. Does not remove what is already there.
# The libraries go to .device/stepquant_lib/ and are overwritten there: the
# shared .device/lib/ may hold older builds of the same kernels/ libraries
# (copied without clobbering), which would not contain the STEPQuant kernels.
#   kernels/cuda/stage_stepquant_device.sh      # builds, then copies
# Then, on the device (one run call, carry=[".device"]):
#   LD_LIBRARY_PATH=.device/stepquant_lib .device/stepquant_cuda_test
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
bazel build //kernels/cuda:stepquant_cuda_test
mkdir -p .device/stepquant_lib
bin_dir="$(bazel info bazel-bin 2>/dev/null)"
bin=kernels/cuda/stepquant_cuda_test
cp -Lf "$bin_dir/$bin" .device/
ldd "$bin_dir/$bin" | awk '/=>/ {print $3}' | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*) ;;
    *) cp -Lf "$lib" .device/stepquant_lib/ ;;
  esac
done
ls -la .device/stepquant_cuda_test
LD_LIBRARY_PATH=.device/stepquant_lib ldd .device/stepquant_cuda_test | grep "not found" && exit 1
du -sh .device .device/stepquant_lib
true
