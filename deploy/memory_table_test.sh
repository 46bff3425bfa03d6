#!/usr/bin/env bash
# //deploy:memory_table_test: the memory table has every format and the
# anchor values that follow from the packed-head layout.
set -euo pipefail
bin="${TEST_SRCDIR:+$TEST_SRCDIR/statecache/deploy/memory_table}"
bin="${bin:-$(dirname "${BASH_SOURCE[0]}")/../bazel-bin/deploy/memory_table}"
out=$("$bin" --budget_gib=64)
echo "$out"
expect() {
  grep -qF -- "$1" <<<"$out" || { echo "FAIL: missing row text: $1" >&2; exit 1; }
}
expect "| fp32 | 32.000 | 65,536 | 60.00 | 40.00 | 144.00 | 100.0% | 1,092 | 1,638 | 455 |"
expect "| damp:16 | 9.875 | 20,224 | 18.52 | 12.34 | 44.44 | 30.9% |"
expect "| nvfp4 | 4.500 | 9,232 |"
rows=$(grep -c '^| [a-z]' <<<"$out")
[ "$rows" -eq 12 ] || { echo "FAIL: $rows rows (header + 11 formats expected)" >&2; exit 1; }
echo "memory_table_test: PASS"
