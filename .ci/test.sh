#!/usr/bin/env bash
# The README's test command: installs what is missing, builds everything
# (CUDA objects included) and runs every test that is not tagged benchmark,
# fuzz or gpu_only. Exits non-zero when any test fails.
set -uo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup.sh || exit 1
log=$(mktemp)
bazel test --test_summary=short //... 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
passed=$(grep -cE '^//.* PASSED' "$log" || true)
failed=$(grep -cE '^//.* (FAILED|TIMEOUT|NO STATUS|INCOMPLETE)' "$log" || true)
rm -f "$log"
echo "bazel: ${passed} passed, ${failed} failed"
exit "$rc"
