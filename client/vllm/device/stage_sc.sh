#!/bin/bash
# Re-stages only statecache's native half of issue 28's GPU bundle
# (statecached and libstatecache_dataplane.so, stripped; the generated gRPC
# stubs of this checkout's proto) into
# .device/vllm_sc/sc.tar.xz (git-ignored, a few MiB; with the non-glibc
# libraries both need), for a checkout whose
# C++ changed since the vLLM parts were staged (stage.sh): carry
# ".device/vllm_sc" with any run.sh call and run.sh unpacks it over the
# installed /tmp/sc_vllm/sc and site/statecache/v1.
#   bash client/vllm/device/stage_sc.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
D=.device/vllm_sc
bazel build --jobs=2 //server:statecached //client/python:libstatecache_dataplane.so
bin_dir="$(bazel info bazel-bin 2>/dev/null)"
rm -rf "$D" && mkdir -p "$D/sc/lib"
cp -Lf "$bin_dir/server/statecached" "$D/sc/"
cp -Lf "$bin_dir/client/python/libstatecache_dataplane.so" "$D/sc/lib/"
chmod u+w "$D/sc/statecached" "$D/sc/lib/libstatecache_dataplane.so"
strip --strip-unneeded "$D/sc/statecached" "$D/sc/lib/libstatecache_dataplane.so"
source tests/stage_deps.sh
copy_deps "$bin_dir/server/statecached" "$D/sc/lib"
copy_deps "$bin_dir/client/python/libstatecache_dataplane.so" "$D/sc/lib"
git log -1 --format='%H %s' > "$D/sc/STAGED_SC"
# The gRPC stubs of this checkout's proto (run.sh overlays the Python sources).
top=$PWD
(cd client/python && "${STATECACHE_TORCH_VENV:-$HOME/.cache/statecache-venv-torch}/bin/python" \
   -m statecache._gen --out "$top/$D/stubs" --proto_root "$top/proto" >/dev/null)
mkdir -p "$D/site/statecache" && mv "$D/stubs/statecache/v1" "$D/site/statecache/"
tar -C "$D" -cf - sc site | xz -T2 -6 > "$D/sc.tar.xz"
rm -rf "$D/sc" "$D/site" "$D/stubs"
echo "staged $(stat -c %s "$D/sc.tar.xz") bytes in $D/sc.tar.xz"
