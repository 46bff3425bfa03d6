#!/usr/bin/env bash
# The README's test command: installs what is missing, builds everything
# (CUDA objects included) and runs every test that is not tagged benchmark,
# fuzz or gpu_only, then the checks that cannot run inside a bazel test
# (they run bazel themselves): a plain `pip install ./client/python` into a
# fresh venv and statecache.torch from it (pip_install_e2e.sh), and the BUILD
# package-cycle check over `bazel query` (tools/check_package_cycles.py). Exits
# non-zero when any test or check fails.
set -uo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup.sh || exit 1
log=$(mktemp)
bazel test --test_summary=short //... 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
passed=$(grep -cE '^//.* PASSED' "$log" || true)
failed=$(grep -cE '^//.* (FAILED|TIMEOUT|NO STATUS|INCOMPLETE)' "$log" || true)
rm -f "$log"
outside_passed=0 outside_failed=0
for check in client/python/tests/compat/pip_install_e2e.sh tools/check_package_cycles.py; do
  if case "$check" in *.py) python3 "$check" ;; *) bash "$check" ;; esac; then
    outside_passed=$((outside_passed + 1))
  else
    echo "FAILED: $check" >&2
    outside_failed=$((outside_failed + 1))
    [ "$rc" -ne 0 ] || rc=1
  fi
done
echo "bazel: ${passed} passed, ${failed} failed; outside bazel: ${outside_passed} passed," \
  "${outside_failed} failed"
exit "$rc"
