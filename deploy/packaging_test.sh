#!/usr/bin/env bash
# //deploy:packaging_test: the container image definition, the kustomize
# overlay (+ PodMonitor, TLS component) and LICENSE, checked statically by
# check_packaging.py (docker cannot run in CI).
set -euo pipefail
# The Dockerfile's COPY sources are the whole source tree, not only this
# test's runfiles: resolve the runfiles symlink of check_packaging.py back to
# the checkout (the test is tagged external: never cached).
runfiles="${TEST_SRCDIR:+$TEST_SRCDIR/statecache}"
runfiles="${runfiles:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
root="$(dirname "$(dirname "$(realpath "$runfiles/deploy/check_packaging.py")")")"
home_dir=$(getent passwd "$(id -u)" | cut -d: -f6)
venv=${STATECACHE_VENV:-$home_dir/.cache/statecache-venv}
if [ ! -x "$venv/bin/python" ]; then
  echo "FAIL: no Python venv at $venv; run: bash .ci/setup_extra.sh" >&2
  exit 1
fi
statecached="$runfiles/server/statecached"
PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" "$root/deploy/check_packaging.py" "$root" "$statecached"
echo "packaging_test: PASS"
