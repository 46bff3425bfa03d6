#!/usr/bin/env bash
# //tests/prometheus:prometheus_test: a real Prometheus server scrapes a real
# statecached (see prometheus_e2e.py). Needs Debian's `prometheus` and the
# Python venv, both installed by .ci/setup_extra.sh; FAILS when either is
# missing (CI installs them, so a missing one is a setup bug, not a skip).
set -euo pipefail
root="${TEST_SRCDIR:+$TEST_SRCDIR/statecache}"
root="${root:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
prometheus=$(command -v prometheus || true)
[ -n "$prometheus" ] || prometheus=/usr/bin/prometheus
if [ ! -x "$prometheus" ]; then
  echo "FAIL: prometheus server not installed; run: bash .ci/setup_extra.sh" >&2
  exit 1
fi
home_dir=$(getent passwd "$(id -u)" | cut -d: -f6)
venv=${STATECACHE_VENV:-$home_dir/.cache/statecache-venv}
if [ ! -x "$venv/bin/python" ]; then
  echo "FAIL: no Python venv at $venv; run: bash .ci/setup_extra.sh" >&2
  exit 1
fi
statecached="$root/server/statecached"
[ -x "$statecached" ] || statecached="$root/bazel-bin/server/statecached"
export PYTHONDONTWRITEBYTECODE=1
exec "$venv/bin/python" "$root/tests/prometheus/prometheus_e2e.py" "$root" "$statecached" \
  "$prometheus"
