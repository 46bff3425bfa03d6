#!/bin/bash
# Starts a statecached binary as its own process on a loopback port, runs the
# issue 33 mixed workload against it with statecache_load, stops it (SIGTERM
# to its pid) and prints the load tool's report. Exit status: the load's.
#   tests/load/run_mixed.sh STATECACHED LOAD PORT [server flags...] -- [load flags...]
# e.g.
#   tests/load/run_mixed.sh bazel-bin/server/statecached bazel-bin/tests/load/statecache_load \
#     50611 --backend=cpu -- --steps=50
set -uo pipefail
server=$1 load=$2 port=$3
shift 3
sflags=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do sflags+=("$1"); shift; done
[ $# -gt 0 ] && shift
log=$(mktemp /tmp/run_mixed_server.XXXXXX)
"$server" --listen=127.0.0.1:"$port" --metrics_port=-1 --state_memory_bytes=1073741824 \
  --checkpoint_memory_bytes=16777216 --slot_idle_timeout_ms=0 "${sflags[@]}" > "$log" 2>&1 &
pid=$!
for _ in $(seq 300); do grep -q server_started "$log" && break; sleep 0.1; done
if ! grep -q server_started "$log"; then
  echo "run_mixed: statecached did not start:"; cat "$log"; kill "$pid" 2>/dev/null; exit 1
fi
"$load" --workload=mixed --target=127.0.0.1:"$port" "$@"
rc=$?
kill -TERM "$pid"
wait "$pid"
rm -f "$log"
exit $rc
