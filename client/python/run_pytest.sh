#!/usr/bin/env bash
# Runs the statecache Python tests with the venv made by .ci/setup_extra.sh
# (~/.cache/statecache-venv, or $STATECACHE_VENV). Used by the Bazel target
# //client/python:python_test (which also provides //server:statecached), and
# by hand: bash client/python/run_pytest.sh [pytest args].
# Fails (never skips) when the venv is missing: CI installs it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
home_dir=$(getent passwd "$(id -u)" | cut -d: -f6)
venv=${STATECACHE_VENV:-$home_dir/.cache/statecache-venv}
if [ ! -x "$venv/bin/python" ]; then
  echo "run_pytest: no Python venv at $venv; run: bash .ci/setup_extra.sh" >&2
  exit 1
fi
if [ -n "${TEST_SRCDIR:-}" ]; then
  export STATECACHE_REQUIRE_SERVER=1
  export STATECACHE_REQUIRE_NATIVE_PREFIX=1
  export PYTHONDONTWRITEBYTECODE=1
fi
cd "$here"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
