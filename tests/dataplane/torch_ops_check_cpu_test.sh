#!/bin/bash
# //tests/dataplane:torch_ops_check_cpu_test: torch_ops_check.py (the
# device's statecache.torch check) on the CPU backend with CPU torch tensors,
# in the torch venv of .ci/setup_extra.sh (~/.cache/statecache-venv-torch).
# Fails (never skips) without that venv.
#   args: torch_ops_check.py statecached torch_check_ops libstatecache_dataplane.so
set -uo pipefail
check=$1 statecached=$2 ops=$3 lib=$4
python_root="$(cd "$(dirname "$check")/../../client/python" && pwd)"
home_dir=$(getent passwd "$(id -u)" | cut -d: -f6)
venv=${STATECACHE_TORCH_VENV:-$home_dir/.cache/statecache-venv-torch}
if [ ! -x "$venv/bin/python" ]; then
  echo "no torch venv at $venv: run bash .ci/setup_extra.sh" >&2
  exit 1
fi
out=$("$venv/bin/python" "$check" --backend=cpu --statecached="$statecached" --ops="$ops" \
      --library="$lib" --python_root="$python_root" --formats=damp:16,fp32 2>&1)
rc=$?
echo "$out"
grep -q '^RESULT torch_ops_check: PASS' <<<"$out" || rc=1
# Every check line is there (a check that silently did not run fails).
for name in "eager == eager ops, o bytes" "padding row of o is zero" \
            "states of A and B byte-identical" "NaN q in a replay -> InvalidArgument" \
            "pack then copy_slots: B equals A" "prefill of 3 tokens: o and states equal on twins" \
            "copy to a repeated destination -> InvalidArgument" \
            "failed replay wrote nothing" "out_dtype=bfloat16 is o rounded" \
            "g float64 -> InvalidArgument g" "non-contiguous v -> InvalidArgument v" \
            "op after detach -> FailedPrecondition"; do
  for tag in "[gdn damp:16]" "[kda fp32]"; do
    grep -qF "PASS $tag $name" <<<"$out" || { echo "MISSING: PASS $tag $name"; rc=1; }
  done
done
exit $rc
