"""Executed instructions per source line of one kernel, from an ncu SASS
export and the matching cubin's line table.

    # here: the cubin of the staged binary, disassembled with line info
    cuobjdump -xelf all .device/decode_bench            # recurrence_kernel{,_affine}.sm_90a.cubin
    nvdisasm -g -c recurrence_kernel_affine.sm_90a.cubin > lines.txt   # damp, int8/int4[-h]
    python3 kernels/bench/ncu_lines.py lines.txt \
        PipelinedDecodeKernelILNS_11StateFormatE9ELb1ELi1E damp_sass.csv [N]

(cuobjdump / nvdisasm: the nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm
wheels from PyPI work here.) Prints, per source line (innermost inlined
location), the instructions executed per thread per item (the counts divided
by 65536 = 8192 items x 8 warps of decode_bench's B = 256 run) and the share
of stall samples; the first line counts SASS opcodes that did not match (a
different build).
"""
import collections
import csv
import re
import sys


def main():
    dis = open(sys.argv[1]).read().split("\n")
    name = sys.argv[2]
    start = next(i for i, l in enumerate(dis) if l.startswith(".text.") and name in l)
    where, ops, cur = {}, {}, None
    for line in dis[start + 1:]:
        if line.startswith("//-----"):
            break
        m = re.match(r'\s*//## File "([^"]+)", line (\d+)', line)
        if m:
            cur = m.group(1).split("/")[-1] + ":" + m.group(2)
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*)", line)
        if m:
            off = int(m.group(1), 16)
            where[off] = cur
            ops[off] = re.sub(r"^@!?U?P\w+\s+", "", m.group(2)).split(" ")[0]
    rows = list(csv.reader(open(sys.argv[3])))
    header = rows[1]
    ix = {h: i for i, h in enumerate(header)}
    data = [r for r in rows[2:] if len(r) >= len(header)]
    base = int(data[0][ix["Address"]], 16)
    executed, samples = collections.Counter(), collections.Counter()
    mismatched = 0
    for r in data:
        off = int(r[ix["Address"]], 16) - base
        op = re.sub(r"^@!?U?P\w+\s+", "", r[ix["Source"]].strip()).split(" ")[0]
        mismatched += ops.get(off) != op
        executed[where.get(off)] += float(r[ix["Instructions Executed"]].replace(",", "") or 0)
        samples[where.get(off)] += float(
            r[ix["Warp Stall Sampling (All Samples)"]].replace(",", "") or 0)
    print("mismatched opcodes", mismatched, "of", len(data))
    total_samples = sum(samples.values()) or 1.0
    for line, count in executed.most_common(int(sys.argv[4]) if len(sys.argv) > 4 else 60):
        print(f"{count / 65536:8.1f} {100 * samples[line] / total_samples:5.1f}%  {line}")


if __name__ == "__main__":
    main()
