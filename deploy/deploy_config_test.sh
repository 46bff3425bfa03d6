#!/usr/bin/env bash
# //deploy:deploy_config_test: validates deploy/ with the real tools.
#  - promtool check config / check rules / test rules (Debian `prometheus`,
#    installed by .ci/setup_extra.sh; a missing promtool FAILS the test);
#  - check_deploy.py: metric names vs server/metrics.cc, flags vs
#    server/statecached_main.cc, Kubernetes manifests, dashboard regenerated,
#    and the real statecached started from each shipped flag file;
#  - systemd-analyze verify of the unit (where systemd-analyze exists).
set -euo pipefail
root="${TEST_SRCDIR:+$TEST_SRCDIR/statecache}"
root="${root:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
d="$root/deploy"

promtool=$(command -v promtool || true)
[ -n "$promtool" ] || promtool=/usr/bin/promtool
if [ ! -x "$promtool" ]; then
  echo "FAIL: promtool not found; run: bash .ci/setup_extra.sh (Debian package prometheus)" >&2
  exit 1
fi
"$promtool" check config "$d/prometheus/prometheus.yml"
"$promtool" check rules "$d/prometheus/statecache_rules.yml"
(cd "$d/prometheus" && "$promtool" test rules statecache_rules_test.yml)

home_dir=$(getent passwd "$(id -u)" | cut -d: -f6)
venv=${STATECACHE_VENV:-$home_dir/.cache/statecache-venv}
if [ ! -x "$venv/bin/python" ]; then
  echo "FAIL: no Python venv at $venv; run: bash .ci/setup_extra.sh" >&2
  exit 1
fi
statecached="$root/server/statecached"
[ -x "$statecached" ] || statecached="$root/bazel-bin/server/statecached"
PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" "$d/check_deploy.py" "$root" "$statecached"

if command -v systemd-analyze >/dev/null; then
  tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/unit.XXXXXX")
  sed 's#^ExecStart=/usr/local/bin/statecached#ExecStart=/bin/true#' \
    "$d/systemd/statecached.service" >"$tmp/statecached.service"
  out=$(systemd-analyze verify "$tmp/statecached.service" 2>&1) || { echo "$out"; exit 1; }
  if [ -n "$out" ]; then echo "FAIL: systemd-analyze verify:"; echo "$out"; exit 1; fi
  echo "systemd-analyze verify: OK"
else
  echo "note: systemd-analyze not installed; unit file not verified"
fi
echo "deploy_config_test: PASS"
