#!/bin/bash
# The issue 33 GPU run, one call on the device machine from the repository
# root after tests/load/stage_device.sh (carry [".device/load"]):
#   (a) cuda_concurrency_test: 16 threads on disjoint slots equal a serial
#       replay byte for byte, ordering after the backend stream, and the
#       per-call time of 1 vs 16 threads (CONCURRENCY line);
#   (b) cuda_backend_test (the validated binding: every error message);
#   (c) the 64-client mixed workload (48 unary + 16 UpdateStream clients,
#       distinct slots, 2 layers, 4 value heads of 128 x 128, one token per
#       call, 500 steps) against statecached --backend=cuda in its own
#       process: coalescing off, on, on with a 100 us wait; gRPC threads 16
#       (64 is the default); the baseline binary when staged. Each run
#       replays serially and compares every slot's bytes (result=OK);
#   (d) update_echo_bench --backend=cuda: unary Update at 1 client vs a bare
#       gRPC echo of the same bytes at 4 KiB, 64 KiB, 8 MiB (ECHO lines, and
#       PHASES lines: where the server's Update time goes; "base ECHO" lines:
#       the same from the baseline binary when staged with BASE_ECHO_BENCH);
#   (e) multi_worker_bench: Qwen3.6-35B-A3B geometry, 30 layers through
#       SubmitUpdates, 1 worker alone then 8 workers at once on distinct
#       slots (MULTI / VERIFY / MULTI_SUMMARY lines): B = 256 with one wait
#       per step, B = 256 with a host wait per layer (--layer_waits), B = 16.
#       Skipped with SKIP_MULTI=1; MULTI_WORKERS / MULTI_STEPS change its size,
#       MULTI_RUNS picks runs by name (default "b256 b256_layer_waits b16";
#       also b256_blocking / b16_blocking: STATECACHE_QUEUE_BLOCKING_SYNC=1).
# Logs and summary.txt go to $OUT (or /tmp/sc_out). Expected ~5 minutes;
# worst case (timeouts) ~9 minutes. Only (e): ONLY_MULTI=1. MIXED picks the
# runs of (c) by name (default: "default coalesce coalesce_wait100us
# grpc_threads16 baseline").
set -o pipefail
OUT=${OUT:-/tmp/sc_out}
mkdir -p "$OUT"
D=$PWD/.device/load
U=/tmp/sc_load
if [ ! -x "$U/statecached" ]; then
  rm -rf "$U" && mkdir -p "$U"
  tar -C "$U" -xJf "$D/bundle.tar.xz" || { echo "cannot unpack $D/bundle.tar.xz"; exit 1; }
fi
export LD_LIBRARY_PATH=$U/lib
cat "$U/STAGED" | tee "$OUT/staged.txt"
nproc | sed 's/^/cores=/' | tee -a "$OUT/staged.txt"
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }
multi() {  # (e): pipelined steps at B = 256, then per-layer host waits, then B = 16
  local run args
  for run in "b256 --batch=256" "b256_layer_waits --batch=256 --layer_waits" "b16 --batch=16" \
             "b256_blocking --batch=256" "b16_blocking --batch=16"; do
    args=${run#* }
    run=${run%% *}
    [[ " ${MULTI_RUNS:-b256 b256_layer_waits b16} " == *" $run "* ]] || continue
    # *_blocking: the spawned statecached's queues sleep on blocking-sync
    # events instead of spinning (LaunchOptions::queue_blocking_sync).
    local blocking=0
    [[ $run == *_blocking ]] && blocking=1
    STATECACHE_QUEUE_BLOCKING_SYNC=$blocking timeout 200 $U/multi_worker_bench --backend=cuda --server=spawn --statecached=$U/statecached \
      $args --workers=${MULTI_WORKERS:-8} --steps=${MULTI_STEPS:-20} --warmup=3 \
      --verify_slots=2 > "$OUT/multi_worker_bench_$run.log" 2> "$OUT/multi_worker_bench_$run.err"
    summary "multi_worker_bench $run exit=$?"
    grep -E '^(# multi|MULTI|VERIFY)' "$OUT/multi_worker_bench_$run.log" | tee -a "$OUT/summary.txt"
  done
}
if [ -n "${ONLY_MULTI:-}" ]; then multi; exit 0; fi
timeout 120 $U/cuda_concurrency_test > "$OUT/cuda_concurrency_test.log" 2>&1
summary "cuda_concurrency_test exit=$?  $(grep -E 'PASSED|FAILED|SKIPPED \]|CONCURRENCY' "$OUT/cuda_concurrency_test.log" | tr '\n' ' ')"
timeout 150 $U/cuda_backend_test --gtest_brief=1 > "$OUT/cuda_backend_test.log" 2>&1
summary "cuda_backend_test exit=$?  $(grep -E 'PASSED|FAILED|SKIPPED \]' "$OUT/cuda_backend_test.log" | head -5 | tr '\n' ' ')"
mixed() {  # mixed NAME BINARY [server flags...]
  local name=$1 bin=$2
  shift 2
  [[ " ${MIXED:-default coalesce coalesce_wait100us grpc_threads16 baseline} " == *" $name "* ]] || return 0
  timeout 100 bash $U/run_mixed.sh "$bin" $U/statecache_load 50700 --backend=cuda "$@" -- \
    --steps=${STEPS:-500} > "$OUT/mixed_$name.log" 2>&1
  local rc=$?
  summary "mixed $name exit=$rc $(grep -E '^clients=|^result=' "$OUT/mixed_$name.log" | tr '\n' ' ')"
}
mixed default $U/statecached
mixed coalesce $U/statecached --coalesce_updates
mixed coalesce_wait100us $U/statecached --coalesce_updates --coalesce_max_delay_us=100
mixed grpc_threads16 $U/statecached --grpc_threads=16
[ -x $U/statecached_base ] && mixed baseline $U/statecached_base
timeout 150 $U/update_echo_bench --backend=cuda --sizes=4096,65536,8388608 \
  > "$OUT/update_echo_bench.log" 2>&1
summary "update_echo_bench exit=$?"
grep -E '^(backend|ECHO) ' "$OUT/update_echo_bench.log" | tee -a "$OUT/summary.txt"
if [ -x $U/update_echo_bench_base ]; then  # the baseline binary, same sizes (no PHASES lines)
  timeout 150 $U/update_echo_bench_base --backend=cuda --sizes=4096,65536,8388608 \
    > "$OUT/update_echo_bench_base.log" 2>&1
  summary "update_echo_bench_base exit=$?"
  grep -E '^ECHO ' "$OUT/update_echo_bench_base.log" | sed 's/^/base /' | tee -a "$OUT/summary.txt"
fi
timeout 100 $U/update_echo_bench --backend=cuda --sizes=4096,65536 --coalesce_updates \
  > "$OUT/update_echo_bench_coalesce.log" 2>&1
summary "update_echo_bench --coalesce_updates exit=$?"
grep -E '^ECHO ' "$OUT/update_echo_bench_coalesce.log" | sed 's/^/coalesce /' | tee -a "$OUT/summary.txt"
[ -z "${SKIP_MULTI:-}" ] && multi
