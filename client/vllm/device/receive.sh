#!/bin/bash
# On the device, from the repository root: moves the staged parts this call
# carried (.device/vllm/pNN/part.NN, with SHA256SUMS) to /tmp/sc_vllm/parts
# (outside the tree: kept while the machine stays warm) and checks each one.
# Prints "RECEIVED part.NN ok" per part and what is still missing.
set -uo pipefail
dst=/tmp/sc_vllm/parts
mkdir -p "$dst"
rc=0
for d in .device/vllm/p*/; do
  [ -d "$d" ] || continue
  cp -f "$d"/SHA256SUMS "$dst/" 2>/dev/null
  for f in "$d"/part.*; do
    [ -f "$f" ] || continue
    b=$(basename "$f")
    cp -f "$f" "$dst/$b"
    if (cd "$dst" && grep " $b\$" SHA256SUMS | sha256sum -c --quiet -); then
      echo "RECEIVED $b ok ($(stat -c %s "$dst/$b") bytes)"
    else
      echo "RECEIVED $b CHECKSUM MISMATCH"; rc=1
    fi
  done
done
[ -f "$dst/SHA256SUMS" ] || { echo "no SHA256SUMS received"; exit 1; }
missing=$(cd "$dst" && awk '{print $2}' SHA256SUMS | while read -r p; do [ -f "$p" ] || echo "$p"; done)
echo "MISSING ${missing:-none}"
df -h /tmp | tail -1
exit $rc
