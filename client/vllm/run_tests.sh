#!/usr/bin/env bash
# Runs the vLLM plugin's tests (client/vllm/tests) with the torch venv of
# .ci/setup_extra.sh (~/.cache/statecache-venv-torch, or $STATECACHE_TORCH_VENV),
# which has no vLLM: test_vllm_stubbed.py stubs the vLLM names the plugin uses.
# Used by //client/vllm:plugin_test (args: statecached, libstatecache_dataplane.so)
# and by hand after `bazel build //server:statecached
# //client/python:libstatecache_dataplane.so`:  bash client/vllm/run_tests.sh
# Fails (never skips) when the venv or a binary is missing, or when vLLM is
# importable there (the tests would no longer prove the plugin's logic runs
# without it).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
home_dir=$(getent passwd "$(id -u)" | cut -d: -f6)
venv=${STATECACHE_TORCH_VENV:-$home_dir/.cache/statecache-venv-torch}
if [ ! -x "$venv/bin/python" ]; then
  echo "run_tests: no torch venv at $venv; run: bash .ci/setup_extra.sh" >&2
  exit 1
fi
if [ $# -ge 2 ]; then
  STATECACHED="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
  STATECACHE_DATAPLANE_LIB="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
  export STATECACHED STATECACHE_DATAPLANE_LIB
  shift 2
fi
if "$venv/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "run_tests: vllm is importable in $venv; these tests need an environment without it" >&2
  exit 1
fi
export PYTHONDONTWRITEBYTECODE=1
cd "$here"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
