#!/bin/bash
# The fixed-shape decode kernels (PipelinedDecodeKernel<F, true, dtype>: the
# 128 x 128 serving path of every format and input dtype) must not spill:
# they run at their 128-register limit, and a spill of a few hoisted values
# costs 12-17% on the H200 (docs/BENCHMARKS.md, issue 5). Reads ptxas's
# resource report of recurrence_kernel.cu (cuda_library keeps it, output
# group "ptxas"); needs no GPU.
#   usage: fixed_kernel_spills_test.sh <ptxas reports...>  (recurrence_kernel's is used)
set -u
report=""
for f in "$@"; do
  case "$f" in */recurrence_kernel.ptxas.txt) report="$f" ;; esac
done
[ -s "$report" ] || { echo "FAIL: no recurrence_kernel.ptxas.txt among: $*"; exit 1; }
# "Function properties for <mangled name>" is followed by
# "    N bytes stack frame, N bytes spill stores, N bytes spill loads".
awk '
  /Function properties for .*PipelinedDecodeKernel.*StateFormatE[0-9]+ELb1ELi[0-9]E/ {
    name = $NF; sub(/.*PipelinedDecodeKernelILNS_11StateFormatE/, "format ", name);
    sub(/EEEvNS0_.*/, "", name); sub(/ELb1ELi/, " dtype ", name);
    getline props; ++found;
    if (props !~ /^ *0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads/) {
      print "FAIL: " name ":" props; ++bad;
    }
  }
  END {
    # 11 formats x 3 input dtypes.
    if (found != 33) { print "FAIL: expected 33 fixed-shape decode kernels, found " found; exit 1 }
    if (bad > 0) exit 1;
    print "ok: " found " fixed-shape decode kernels, no stack frame, no spills";
  }' "$report"
