#!/bin/bash
# Stages the GPU run of statecache.integrations (issue 27) into
# .device/integrations/ (git-ignored): statecached and the C++ reference
# worker (CUDA builds),
# libstatecache_dataplane.so / libstatecache_prefix.so with the non-glibc
# libraries they need, and the statecache package with its generated gRPC
# stubs (statecache/v1), the shipped models and corpora of ../shared
# (or $STATECACHE_SHARED_DIR; ~35 MB), packed into bundle.tar.xz; and FLA's two wheels
# (fla-core, flash-linear-attention 0.6.0: layers and models) into .whl/
# when missing there (pip download, never committed).
#   tests/integrations/stage_device.sh
# Then, on the device (one run call, carry [".device/integrations", ".whl"]):
#   bash tests/integrations/device_run.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
D=.device/integrations
S=.device/integrations.staging
bazel build //server:statecached //client/worker:worker \
  //client/python:libstatecache_dataplane.so //client/python:libstatecache_prefix.so
rm -rf "$S" "$D"
mkdir -p "$S/lib" "$S/python" "$D"
bin_dir="$(bazel info bazel-bin 2>/dev/null)"
source tests/stage_deps.sh
for bin in server/statecached client/worker/worker; do
  stage_binary "$bin_dir/$bin" "$S" "$S/lib"
done
for so in libstatecache_dataplane.so libstatecache_prefix.so; do
  stage_binary "$bin_dir/client/python/$so" "$S/lib" "$S/lib"
done
# The package and its stubs (generated here: the device needs no grpcio-tools).
(cd client/python && tar -cf - --exclude=__pycache__ --exclude='statecache/v1' statecache) \
  | tar -C "$S/python" -xf -
py=${STATECACHE_TORCH_VENV:-$HOME/.cache/statecache-venv-torch}/bin/python
(cd client/python && "$py" -m statecache._gen --out "$PWD/../../$S/python" \
  --proto_root "$PWD/../../proto" >/dev/null)
shared=${STATECACHE_SHARED_DIR:-$PWD/../shared}
mkdir -p "$S/shared/corpus"
cp "$shared"/corpus/*.jsonl "$S/shared/corpus/"
for m in gdn-tiny kda-tiny; do
  mkdir -p "$S/shared/models/$m"
  cp "$shared/models/$m"/{config.json,model.safetensors,golden.safetensors} "$S/shared/models/$m/"
done
{ git log -1 --format='%H %s'; git status --short --untracked-files=no; date -u; } > "$S/STAGED"
cp "$S/STAGED" "$D/STAGED"
tar -C "$S" -cf - . | xz -T0 -6 > "$D/bundle.tar.xz"
mkdir -p .whl
ls .whl/fla_core-0.6.0-*.whl >/dev/null 2>&1 || \
  python3 -m pip download -q --no-deps -d .whl fla-core==0.6.0
ls .whl/flash_linear_attention-0.6.0-*.whl >/dev/null 2>&1 || \
  python3 -m pip download -q --no-deps -d .whl flash-linear-attention==0.6.0
bytes=$(( $(du -sb "$D" | cut -f1) + $(du -sb .whl | cut -f1) ))
echo "staged $bytes bytes in $D and .whl (carry limit 67108864)"
test "$bytes" -lt 67108864
