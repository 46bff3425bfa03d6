#!/bin/bash
# statecached refuses bad flag values before serving (exit status 2 and a
# message naming the flag), logs what its flags really configured, and
# --version names the project version and git revision.
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
expect_refused --grpc_threads=-1 "--grpc_threads / --grpc_completion_queues must be >= 0"
expect_refused --grpc_completion_queues=-2 "--grpc_threads / --grpc_completion_queues must be >= 0"
expect_refused --coalesce_max_batch=0 "--coalesce_max_batch must be >= 1"
expect_refused --coalesce_max_delay_us=-1 "--coalesce_max_delay_us and --staging_cache_bytes >= 0"

# --version: project version (top-level VERSION) and git revision, optimized
# (NDEBUG) by default; never absl's "Debug build (NDEBUG not #defined)".
version="$(cat "${TEST_SRCDIR}/statecache/VERSION")"
out="$("$bin" --version 2>&1)"
rc=$?
want_re="^statecached ${version//./\\.}"$'\n'"revision ([0-9a-f]{40}|unknown)"$'\n'"optimized build$"
if [[ $rc -ne 0 || ! "$out" =~ $want_re ]]; then
  echo "FAIL: --version: exit $rc, output: $out"
  fail=1
else
  echo "ok: --version -> $out"
fi

# --metrics_port=-1: the start-up line says the endpoint is disabled (not
# "metrics_port=0", which reads as "pick a port").
log="${TEST_TMPDIR}/started.log"
sock="/tmp/statecached_flags_test.$$.sock"
"$bin" --listen="unix:${sock}" --backend=cpu --metrics_port=-1 \
  --state_memory_bytes=1048576 --checkpoint_memory_bytes=1048576 2>"$log" &
pid=$!
for _ in $(seq 1 300); do
  grep -q server_started "$log" && break
  sleep 0.1
done
kill -TERM "$pid"
wait "$pid"
rm -f "$sock"
line="$(grep server_started "$log")"
if [[ "$line" != *" metrics_port=-1 metrics=disabled "* ]]; then
  echo "FAIL: --metrics_port=-1 start-up line: $line"
  fail=1
else
  echo "ok: --metrics_port=-1 -> metrics_port=-1 metrics=disabled"
fi
exit $fail
