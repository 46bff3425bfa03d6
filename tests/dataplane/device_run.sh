#!/bin/bash
# The data-plane GPU run (issue 10), one self-contained call on the device
# machine from the repository root, after tests/dataplane/stage_device.sh:
#   (a) CUDA backend gtests, the two-process CUDA IPC test and the
#       DecodeQueue test (the asynchronous SubmitUpdates path);
#   (b) a small-geometry two-process check: statecached spawned as its own
#       process, every mode's o bit-identical to in-process kernel calls
#       (attached, attached_raw, capi = the Python binding's C ABI, buffers =
#       unary Update RPCs on registered buffers, stream = SubmitUpdates with
#       the ring of worker events + device-side waits on the done word,
#       inline);
#   (c) torch_attached_check.py: the Python binding from a PyTorch worker
#       (CUDA tensors, torch.cuda.current_stream() ordering, bit-identical
#       to the server's Update path, errors naming the field);
#   (d) dataplane_bench, all modes at B in {1, 32, 256}, Qwen3.6-35B-A3B
#       geometry, with the same bit-identity check; plus the diagnostic
#       inproc_unchecked (kernels without the binding's validation and
#       per-call host sync: what that sync costs);
#   (e) inproc + stream again with STATECACHE_SUBMIT_DEVICE_WAIT=event (the
#       server's queue waits by cudaStreamWaitEvent, not the ring gate).
# Logs and a summary go to $OUT (or /tmp/sc_out). Worst case 530 s of
# timeouts; expected about 2.5 minutes.
set -o pipefail
OUT=${OUT:-/tmp/sc_out}
mkdir -p "$OUT"
D=$PWD/.device/dataplane
# stage_device.sh packs the binaries (over 64 MiB unpacked) into one bundle.
if [ -f "$D/bundle.tar.xz" ]; then
  U=/tmp/sc_dataplane
  rm -rf "$U" && mkdir -p "$U"
  tar -C "$U" -xJf "$D/bundle.tar.xz" 2>/dev/null ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$D/bundle.tar.xz" "$U" || { echo "cannot unpack $D/bundle.tar.xz"; exit 1; }
  D=$U
fi
export LD_LIBRARY_PATH=$D/lib
# Overrides for a dry run on a CPU machine:
#   BACKEND=cpu BATCHES=2 GEOMETRY=gdn:2:2:4:128:128 bash tests/dataplane/device_run.sh
BACKEND=${BACKEND:-cuda}
BATCHES=${BATCHES:-1,32,256}
GEOMETRY=${GEOMETRY:-gdn:30:16:32:128:128}
MODES=${MODES:-inproc,inproc_unchecked,attached,attached_raw,capi,buffers,stream,inline}
cat "$D/STAGED" 2>/dev/null | tee "$OUT/staged.txt"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv 2>&1 | tee "$OUT/env.txt"
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }

# (a)
timeout 80 $D/cuda_backend_test --gtest_brief=1 > "$OUT/cuda_backend_test.log" 2>&1
summary "cuda_backend_test exit=$?  $(grep -E 'PASSED|FAILED' "$OUT/cuda_backend_test.log" | head -3 | tr '\n' ' ')"
timeout 30 $D/ipc_test > "$OUT/ipc_test.log" 2>&1
summary "ipc_test exit=$?  $(grep -E 'PASSED|FAILED|SKIPPED' "$OUT/ipc_test.log" | head -3 | tr '\n' ' ')"
# The asynchronous SubmitUpdates path: the CUDA DecodeQueue against the
# synchronous binding, the ring gate, no host wait; DIAG line: whether a
# cudaFree blocks while a queue's stream waits on the device.
timeout 60 $D/cuda_queue_test --gtest_brief=1 > "$OUT/cuda_queue_test.log" 2>&1
summary "cuda_queue_test exit=$?  $(grep -E 'PASSED|FAILED|SKIPPED|DIAG' "$OUT/cuda_queue_test.log" | head -4 | tr '\n' ' ')"

# (b) small geometry first: fast, checks the two-process paths before the big run.
timeout 40 $D/dataplane_bench --backend=$BACKEND --server=spawn --statecached=$D/statecached \
  --modes=$MODES --geometry=gdn:2:2:4:128:128 --batches=4 --steps=2 --warmup=1 \
  > "$OUT/two_process_small.log" 2>&1
summary "two_process_small exit=$?  $(grep -cE 'identical=yes' "$OUT/two_process_small.log") of $(( $(tr ',' '\n' <<<"$MODES" | wc -l) - 1 )) modes identical; $(grep -E 'identical=NO|error=' "$OUT/two_process_small.log" | head -3 | tr '\n' ' ')"

# (c) the Python binding from PyTorch: bf16 CUDA tensors made on a
# non-default stream, no sync before the updates; o and states bit-identical
# to unary Update RPCs; field-named errors. One PASS / FAIL line per check.
PYTHONUNBUFFERED=1 timeout 120 python3 tests/dataplane/torch_attached_check.py --dir="$D" \
  --backend=$BACKEND > "$OUT/torch_attached_check.log" 2>&1
summary "torch_attached_check exit=$?  $(grep -E '^RESULT' "$OUT/torch_attached_check.log" | tr '\n' ' ')"
grep -E '^FAIL|ordering control|^INFO grpc|torch \+ library' "$OUT/torch_attached_check.log" | head -12 |
  tee -a "$OUT/summary.txt"
# (d) Qwen3.6-35B-A3B geometry (default), damp, B = 1, 32, 256.
timeout 140 $D/dataplane_bench --backend=$BACKEND --server=spawn --statecached=$D/statecached \
  --modes=$MODES --geometry=$GEOMETRY --batches=$BATCHES --steps=${STEPS:-20} --warmup=3 \
  > "$OUT/bench.log" 2>&1
summary "bench exit=$?"
grep -E '^RESULT|^\||^FAILURES' "$OUT/bench.log" | tee -a "$OUT/summary.txt"

# (e) stream mode with the server's queue waiting on the worker's ring
# events by cudaStreamWaitEvent instead of the ring gate (comparison only).
if [ "$BACKEND" = cuda ]; then
  STATECACHE_SUBMIT_DEVICE_WAIT=event timeout 60 $D/dataplane_bench --backend=$BACKEND \
    --server=spawn --statecached=$D/statecached --modes=inproc,stream --geometry=$GEOMETRY \
    --batches=$BATCHES --steps=${STEPS:-20} --warmup=3 > "$OUT/bench_event_wait.log" 2>&1
  summary "bench_event_wait exit=$?"
  grep -E '^RESULT' "$OUT/bench_event_wait.log" | tee -a "$OUT/summary.txt"
fi
# Server-side errors, if any (statecached logs to stderr in bench.log).
grep -iE 'error|fatal|abort' "$OUT/bench.log" "$OUT/two_process_small.log" | grep -v '^.*RESULT' | head -10
