#!/bin/bash
# Stages the issue 31 host-tier GPU run into .device/host_tier/ (git-ignored;
# its own subfolder, other staged runs in .device/ are left alone):
# restore_bandwidth_bench and host_tier_cuda_test plus the non-glibc shared
# libraries they need, packed into .device/host_tier/bundle.tar.xz.
# device_run.sh unpacks it to /tmp/sc_host_tier.
#   tests/host_tier/stage_device.sh
# Then, on the device (one run call, carry [".device/host_tier"]):
#   bash tests/host_tier/device_run.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
D=.device/host_tier
S=.device/host_tier.staging   # unpacked tree (also ignored; not carried)
targets=(//server/bench:restore_bandwidth_bench //server/pool:host_tier_cuda_test)
bazel build --jobs=2 "${targets[@]}"
rm -rf "$S" "$D"
mkdir -p "$S/lib" "$D"
bin_dir="$(bazel info bazel-bin 2>/dev/null)"
source tests/stage_deps.sh
for bin in server/bench/restore_bandwidth_bench server/pool/host_tier_cuda_test; do
  stage_binary "$bin_dir/$bin" "$S" "$S/lib"
done
{ git log -1 --format='%H %s'; git status --short --untracked-files=no; date -u; } \
  > "$S/STAGED" || true
cp "$S/STAGED" "$D/STAGED"
ls -la "$S"
echo "unpacked $(du -sb "$S" | cut -f1) bytes"
tar -C "$S" -cf - . | xz -T0 -6 > "$D/bundle.tar.xz"
bytes=$(du -sb "$D" | cut -f1)
echo "staged $bytes bytes in $D (carry limit 67108864)"
test "$bytes" -lt 67108864
