#!/bin/bash
# Two processes on the CPU backend: statecached (a child process, unix socket,
# --shared_pools) and a worker (dataplane_bench) that runs attached mode on the
# mapped pool, registered-buffer Updates, a SubmitUpdates stream and inline
# Updates; every mode's o must be bit-identical to in-process kernel calls
# (the tool exits 1 if not).
set -euo pipefail
bench="$1"
statecached="$2"
out="$("$bench" --backend=cpu --server=spawn --statecached="$statecached" \
  --geometry=gdn:2:2:4:128:128 --batches=1,4 --steps=1 --warmup=1 2>/dev/null)"
echo "$out"
test "$(grep -c 'identical=yes' <<<"$out")" -eq 12
