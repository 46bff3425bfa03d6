#!/usr/bin/env bash
# Runs pytest files that need torch + transformers (tests/transformers_check.py)
# in the torch venv of .ci/setup_extra.sh (~/.cache/statecache-venv-torch, or
# $STATECACHE_TORCH_VENV; client/python/requirements-torch.txt). Used by
# //client/python:transformers_check_test, and by hand:
#   bash client/python/run_torch_pytest.sh tests/transformers_check.py [-k ...]
# Fails (never skips) when the venv or transformers is missing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
home_dir=$(getent passwd "$(id -u)" | cut -d: -f6)
venv=${STATECACHE_TORCH_VENV:-$home_dir/.cache/statecache-venv-torch}
if [ ! -x "$venv/bin/python" ]; then
  echo "run_torch_pytest: no torch venv at $venv; run: bash .ci/setup_extra.sh" >&2
  exit 1
fi
if ! "$venv/bin/python" -c 'import torch, transformers' 2>/dev/null; then
  echo "run_torch_pytest: $venv lacks torch or transformers (requirements-torch.txt);" \
       "run: bash .ci/setup_extra.sh" >&2
  exit 1
fi
# Offline: the tests build their models from configs; nothing may reach a hub.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [ -n "${TEST_SRCDIR:-}" ]; then
  export STATECACHE_REQUIRE_SERVER=1
  export STATECACHE_REQUIRE_NATIVE_PREFIX=1
  export PYTHONDONTWRITEBYTECODE=1
  export HF_HOME="${TEST_TMPDIR:-/tmp}/hf"
fi
cd "$here"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
