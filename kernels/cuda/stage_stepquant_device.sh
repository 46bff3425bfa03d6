#!/bin/bash
# Stages the STEPQuant CUDA test and benchmark (issue 9) into .device/stepquant/
# (git-ignored): the two binaries plus the non-glibc shared libraries they
# need (in .device/stepquant/lib, overwritten: other folders under .device/
# may hold older builds of the same kernels/ libraries), and the run script.
#   kernels/cuda/stage_stepquant_device.sh      # builds, then copies
# Then, on the device (one run call, carry=[".device/stepquant"] - 21 MB; < 4 minutes):
#   .device/stepquant/run_stepquant_device.sh   # logs also under $OUT
# and here: python3 kernels/bench/make_table.py <bench log>.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
bazel build //kernels/cuda:stepquant_cuda_test //kernels/cuda:stepquant_bench
dest=.device/stepquant
rm -rf "$dest" && mkdir -p "$dest/lib"
bin_dir="$(bazel info bazel-bin 2>/dev/null)"
for bin in kernels/cuda/stepquant_cuda_test kernels/cuda/stepquant_bench; do
  cp -Lf "$bin_dir/$bin" "$dest/"
  ldd "$bin_dir/$bin" | awk '/=>/ {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*) ;;
      *) cp -Lf "$lib" "$dest/lib/" ;;
    esac
  done
done
cp -f kernels/cuda/run_stepquant_device.sh "$dest/"
for bin in stepquant_cuda_test stepquant_bench; do
  if LD_LIBRARY_PATH="$dest/lib" ldd "$dest/$bin" | grep "not found"; then exit 1; fi
done
ls -la "$dest"
du -sh "$dest"
