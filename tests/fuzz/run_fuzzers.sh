#!/usr/bin/env bash
# Runs each libFuzzer target for $FUZZ_SECONDS seconds (default 25) starting
# from a scratch copy of its seed corpus. Any crash, timeout, OOM or
# sanitizer report fails the test (libFuzzer exits non-zero and leaves the
# reproducer in $TEST_UNDECLARED_OUTPUTS_DIR).
set -uo pipefail
seconds=${FUZZ_SECONDS:-25}
out=${TEST_UNDECLARED_OUTPUTS_DIR:-$(mktemp -d)}
status=0
for name in request import safetensors layout_file; do
  bin="tests/fuzz/${name}_fuzz"
  help=$("$bin" -help=1 2>&1)
  if [[ "$help" != *libFuzzer* ]]; then
    echo "fuzz_test: $bin is not a libFuzzer binary; run with --config=fuzz" >&2
    exit 1
  fi
  work="$TEST_TMPDIR/corpus_$name"
  mkdir -p "$work" && cp "tests/fuzz/corpus/$name/"* "$work/"
  echo "=== $name: ${seconds}s from $(ls "$work" | wc -l) seeds"
  if ! "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$out/${name}-" "$work" 2>"$out/$name.log"; then
    echo "=== $name FAILED; log tail:" && tail -40 "$out/$name.log"
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$out/$name.log"
    grep -E "DONE|cov:" "$out/$name.log" | tail -1
  fi
done
exit $status
