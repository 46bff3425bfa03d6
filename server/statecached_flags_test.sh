#!/bin/bash
# statecached refuses bad flag values before serving: exit status 2 and a
# message naming the flag.
set -u
bin="${TEST_SRCDIR}/statecache/server/statecached"
fail=0
expect_refused() {  # expect_refused <flag=value> <message part>
  out="$("$bin" --listen=unix:/tmp/statecached_flags_test.$$ "$1" 2>&1)"
  rc=$?
  if [[ $rc -ne 2 || "$out" != *"$2"* ]]; then
    echo "FAIL: $1: exit $rc, output: $out"
    fail=1
  else
    echo "ok: $1 -> exit 2: $out"
  fi
}
expect_refused --submit_ring_wait_timeout_ms=0 "--submit_ring_wait_timeout_ms must be > 0"
expect_refused --submit_ring_wait_timeout_ms=-5 "--submit_ring_wait_timeout_ms must be > 0"
expect_refused --report_geometry=bogus "report_geometry"
exit $fail
