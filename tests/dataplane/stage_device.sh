#!/bin/bash
# Stages the data-plane GPU run (issue 10) into .device/dataplane/
# (git-ignored; its own subfolder so that other staged runs in .device/ are
# left alone): binaries plus the non-glibc shared libraries they need.
#   tests/dataplane/stage_device.sh        # builds, then copies
# Then, on the device (one run call, .device carried):
#   bash tests/dataplane/device_run.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
D=.device/dataplane
targets=(//kernels/cuda:cuda_backend_test //kernels/cuda_ipc:ipc_test
         //tests/dataplane:cuda_queue_test
         //server/dataplane:dataplane_bench //server:statecached)
bazel build "${targets[@]}"
mkdir -p "$D/lib"
bin_dir="$(bazel info bazel-bin 2>/dev/null)"
for bin in kernels/cuda/cuda_backend_test kernels/cuda_ipc/ipc_test \
           tests/dataplane/cuda_queue_test \
           server/dataplane/dataplane_bench server/statecached; do
  cp -Lf "$bin_dir/$bin" "$D/"
  # Symbols out (the carried folder must stay under 64 MiB).
  chmod u+w "$D/$(basename "$bin")" && strip --strip-unneeded "$D/$(basename "$bin")"
  ldd "$bin_dir/$bin" | awk '/=>/ {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*) ;;
      *) cp -Ln "$lib" "$D/lib/" 2>/dev/null || true ;;
    esac
  done
done
# What was staged (commit, uncommitted files in the build, time).
{ git log -1 --format='%H %s'; git status --short --untracked-files=no; date -u; } > "$D/STAGED"
ls -la "$D"
bytes=$(du -sb "$D" | cut -f1)
echo "staged $bytes bytes (carry limit 67108864)"
test "$bytes" -lt 67108864
