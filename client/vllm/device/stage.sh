#!/bin/bash
# Stages issue 28's GPU run into .device/vllm/ (git-ignored), in parts that
# each travel in one device call (carry limit 64 MiB per call, repository
# included):
#   bash client/vllm/device/stage.sh [VLLM_WHEEL]
# What goes in (one tar, xz, split into parts of PART_MIB, default 58 MiB):
#   site/vllm, site/vllm-0.26.0.dist-info   the vLLM 0.26.0 wheel, pruned of
#       what an H200 (sm_90) run of these models never loads (PRUNE below:
#       the FlashAttention-2 library - Hopper runs FA3 -, the Blackwell fmha,
#       the Rust frontend binary, deep_gemm builds for other Pythons)
#   wheels/*.whl   the packages vLLM imports that the device image lacks
#       (device/wheels.txt, cp312 manylinux, pip download --no-deps)
#   site/statecache (+ generated gRPC stubs), site/statecache_vllm and a
#       statecache_vllm dist-info holding the vllm.general_plugins entry point
#   sc/statecached, sc/lib/ (libstatecache_dataplane.so and the non-glibc
#       libraries both need), STAGED (commit, sizes)
# Output: .device/vllm/pNN/{part.NN,SHA256SUMS}; prints each part's size.
# Then: the calls listed in client/vllm/device/README.md.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
WHEEL=${1:-/work/wheels/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl}
PART_MIB=${PART_MIB:-58}
DL=${WHEEL_CACHE:-/work/wheels/dl-py312}
D=.device/vllm
S=.device/vllm.staging
PRUNE=(vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/third_party/fmha_sm100 vllm/vllm-rs
       vllm/third_party/deep_gemm/_C.cpython-310-x86_64-linux-gnu.so
       vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so
       vllm/third_party/deep_gemm/_C.cpython-313-x86_64-linux-gnu.so
       vllm/third_party/deep_gemm/_C.cpython-314-x86_64-linux-gnu.so)

bazel build --jobs=2 //server:statecached //client/python:libstatecache_dataplane.so
bin_dir="$(bazel info bazel-bin 2>/dev/null)"
rm -rf "$S" "$D"
mkdir -p "$S/site" "$S/sc/lib" "$S/wheels" "$D"

# vLLM, pruned.
python3 - "$WHEEL" "$S/site" <<'EOF'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
EOF
for p in "${PRUNE[@]}"; do
  [ -e "$S/site/$p" ] || { echo "stage: $p not in the wheel (prune list out of date)" >&2; exit 1; }
  rm -rf "${S:?}/site/$p"
done

# Dependency wheels for the device's Python 3.12.
mkdir -p "$DL"
grep -v '^#' client/vllm/device/wheels.txt | sed '/^\s*$/d' | while read -r req; do
  name=${req%%==*}
  if ! ls "$DL" | grep -qi "^$(echo "$name" | tr '-' '_')-${req##*==}-"; then
    plat=()
    for n in 5 12 17 24 26 27 28 31 34; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp "${plat[@]}" --platform manylinux2014_x86_64 \
      --platform manylinux1_x86_64 --platform any -d "$DL" "$req"
  fi
done
while read -r req; do
  n=$(echo "${req%%==*}" | tr '-' '_'); v=${req##*==}
  f=$(ls "$DL" | grep -i "^${n}-${v}-" | head -1)
  [ -n "$f" ] || { echo "stage: no wheel for $req in $DL" >&2; exit 1; }
  cp "$DL/$f" "$S/wheels/"
done < <(grep -v '^#' client/vllm/device/wheels.txt | sed '/^\s*$/d')

# statecache: binaries, the Python package with its stubs, the plugin.
source tests/stage_deps.sh
cp -Lf "$bin_dir/server/statecached" "$S/sc/"
cp -Lf "$bin_dir/client/python/libstatecache_dataplane.so" "$S/sc/lib/"
chmod u+w "$S/sc/statecached" "$S/sc/lib/libstatecache_dataplane.so"
strip --strip-unneeded "$S/sc/statecached" "$S/sc/lib/libstatecache_dataplane.so"
copy_deps "$bin_dir/server/statecached" "$S/sc/lib"
copy_deps "$bin_dir/client/python/libstatecache_dataplane.so" "$S/sc/lib"
mkdir -p "$S/site/statecache" "$S/site/statecache_vllm"
cp client/python/statecache/*.py client/python/statecache/py.typed "$S/site/statecache/"
top=$PWD
(cd client/python && "${STATECACHE_TORCH_VENV:-$HOME/.cache/statecache-venv-torch}/bin/python" \
   -m statecache._gen --out "$top/$S/stubs" --proto_root "$top/proto" >/dev/null)
cp -r "$S/stubs/statecache/v1" "$S/site/statecache/"
cp client/vllm/statecache_vllm/*.py "$S/site/statecache_vllm/"
di="$S/site/statecache_vllm-0.1.0.dist-info"
mkdir -p "$di"
printf 'Metadata-Version: 2.1\nName: statecache-vllm\nVersion: 0.1.0\n' > "$di/METADATA"
printf '[vllm.general_plugins]\nstatecache = statecache_vllm:register\n' > "$di/entry_points.txt"
: > "$di/RECORD"

{ git log -1 --format='%H %s'; git status --short --untracked-files=no; date -u
  echo "vllm wheel $(basename "$WHEEL") $(stat -c %s "$WHEEL") bytes; pruned: ${PRUNE[*]}"
  echo "site $(du -sb "$S/site" | cut -f1) bytes; wheels $(du -sb "$S/wheels" | cut -f1) bytes ($(ls "$S/wheels" | wc -l)); sc $(du -sb "$S/sc" | cut -f1) bytes"
  ls "$S/wheels"; } > "$S/STAGED"
cat "$S/STAGED"

tar -C "$S" -cf - site wheels sc STAGED | xz -T2 -6 > "$S/all.tar.xz"
echo "compressed $(stat -c %s "$S/all.tar.xz") bytes"
(cd "$S" && split -b "${PART_MIB}M" -d -a 2 all.tar.xz part.)
(cd "$S" && sha256sum part.* > SHA256SUMS)
# What travels besides a part: the tracked and untracked-not-ignored files.
repo=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
for f in "$S"/part.*; do
  n=${f##*.}
  mkdir -p "$D/p$n"
  mv "$f" "$D/p$n/"
  cp "$S/SHA256SUMS" "$D/p$n/"
  bytes=$(du -sb "$D/p$n" | cut -f1)
  echo "part $n: $bytes bytes; with the working tree ($repo bytes) $((bytes + repo)) of 67108864"
  test $((bytes + repo)) -lt 67108864
done
rm -f "$S/all.tar.xz"
