#!/bin/bash
# The fixed-shape decode kernels (PipelinedDecodeKernel<F, true, dtype> and
# StagedFpDecodeKernel<F, dtype>: the 128 x 128 serving path of every format
# and input dtype) must not spill: they run at their 128-register limit, and
# a spill of a few hoisted values costs 12-17% on the H200
# (docs/BENCHMARKS.md, issue 5). Reads ptxas's resource reports of
# recurrence_kernel.cu and recurrence_kernel_affine.cu (cuda_library keeps
# them, output group "ptxas"); needs no GPU.
#   usage: fixed_kernel_spills_test.sh <ptxas reports...>  (the two recurrence ones are used)
set -u
reports=()
for f in "$@"; do
  case "$f" in */recurrence_kernel.ptxas.txt|*/recurrence_kernel_affine.ptxas.txt) reports+=("$f") ;; esac
done
[ "${#reports[@]}" -eq 2 ] && [ -s "${reports[0]}" ] && [ -s "${reports[1]}" ] ||
  { echo "FAIL: expected recurrence_kernel{,_affine}.ptxas.txt among: $*"; exit 1; }
# "Function properties for <mangled name>" is followed by
# "    N bytes stack frame, N bytes spill stores, N bytes spill loads".
awk '
  /Function properties for .*(PipelinedDecodeKernel.*StateFormatE[0-9]+ELb1|StagedFpDecodeKernel.*StateFormatE[0-9]+)ELi[0-9]E/ {
    name = $NF; sub(/.*DecodeKernelILNS_11StateFormatE/, "format ", name);
    sub(/EEEvNS0_.*/, "", name); sub(/(ELb1)?ELi/, " dtype ", name);
    kind = $NF ~ /Staged/ ? "staged " : "pipelined ";
    getline props; ++found; ++count[kind];
    if (props !~ /^ *0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads/) {
      print "FAIL: " kind name ":" props; ++bad;
    }
  }
  END {
    # 10 pipelined formats and 1 staged (fp32) x 3 input dtypes.
    if (count["pipelined "] != 30 || count["staged "] != 3) {
      print "FAIL: expected 30 pipelined and 3 staged fixed-shape decode kernels, found " \
            count["pipelined "] + 0 " and " count["staged "] + 0;
      exit 1;
    }
    if (bad > 0) exit 1;
    print "ok: " found " fixed-shape decode kernels, no stack frame, no spills";
  }' "${reports[@]}"
