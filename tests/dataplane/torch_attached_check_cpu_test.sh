#!/bin/bash
# //tests/dataplane:torch_attached_check_cpu_test: the logic of
# torch_attached_check.py (the device's PyTorch attached-mode check) on the
# CPU backend: statecached --shared_pools, numpy arrays, every check of the
# device run but the CUDA-only ones (device mismatch, stream ordering).
# Runs with the system python3 (numpy; no grpcio: the grpc stand-in) and,
# when present, the venv of .ci/setup_extra.sh (grpcio + ml_dtypes: the
# real grpc module, bf16 inputs).
#   args: torch_attached_check.py statecached torch_check_ops libstatecache_dataplane.so
set -uo pipefail
check=$1 statecached=$2 ops=$3 lib=$4
python_root="$(cd "$(dirname "$check")/../../client/python" && pwd)"
common=(--backend=cpu --statecached="$statecached" --ops="$ops" --library="$lib"
        --python_root="$python_root" --steps=3)
rc=0 runs=0
run() {
  runs=$((runs + 1))
  echo "=== $*"
  out=$("$@" 2>&1)
  local r=$?
  echo "$out"
  if [ $r -ne 0 ] || ! grep -q '^RESULT torch_attached_check: PASS' <<<"$out"; then
    echo "FAILED (exit $r): $*"
    rc=1
  fi
  # Tests that can fail: every check line is there.
  for name in "o bit-identical to server Update" "states after detach bit-identical" \
              "bad shape v" "positive g (backend validation)" "slot not attached" \
              "server Update on attached slots refused" "decode_update after detach"; do
    if ! grep -q "^PASS \[damp:16\] $name" <<<"$out"; then
      echo "MISSING: PASS [damp:16] $name"
      rc=1
    fi
  done
}
if python3 -c 'import numpy' 2>/dev/null; then
  run python3 "$check" "${common[@]}" --dtype=fp32 --grpc=standin
else
  echo "system python3 has no numpy: skipped the stand-in run"
fi
home_dir=$(getent passwd "$(id -u)" | cut -d: -f6)
venv=${STATECACHE_VENV:-$home_dir/.cache/statecache-venv}
if [ -x "$venv/bin/python" ]; then
  run "$venv/bin/python" "$check" "${common[@]}" --dtype=bf16 --tensors=numpy
else
  echo "no venv at $venv: skipped the grpcio + bf16 run"
fi
if [ $runs -eq 0 ]; then
  echo "no python3 with numpy: nothing ran"
  exit 1
fi
exit $rc
