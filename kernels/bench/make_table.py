#!/usr/bin/env python3
"""Turns decode_bench / fla_bench logs into the markdown tables of
docs/BENCHMARKS.md ("GPU kernels (issue 5)").

  python3 kernels/bench/make_table.py bench.log fla.log

Bandwidth = bytes / time with bytes = state read + write (2 x packed state);
% copy = that bandwidth over the measured cudaMemcpy D2D bandwidth (COPY_BW).
Speedup columns compare against the best fp32 kernel at the same B (ours or
FLA's dense V-first / K-major / indexed kernel for that arch).
"""
import re
import sys
from collections import defaultdict

ROW = re.compile(r"^(RESULT|SNAPSHOT) (.*)$")


def parse(paths):
    copy_bw = None
    res = {}
    snaps = {}
    for path in paths:
        for line in open(path):
            line = line.strip()
            if line.startswith("COPY_BW"):
                copy_bw = float(line.split()[1])
            m = ROW.match(line)
            if not m:
                continue
            kv = dict(x.split("=", 1) for x in m.group(2).split())
            if m.group(1) == "RESULT":
                res[(kv["arch"], kv["format"], int(kv["B"]))] = (float(kv["us"]), float(kv["state_bytes"]))
            else:
                snaps[(kv["format"], int(kv["B"]))] = (float(kv["us"]), float(kv["bytes"]))
    return copy_bw, res, snaps


def main():
    copy_bw, res, snaps = parse(sys.argv[1:])
    batches = sorted({b for (_, _, b) in res})
    for arch in ("gdn", "kda"):
        fmts = [f for f in dict.fromkeys(f for (a, f, _) in res if a == arch)]
        if not fmts:
            continue
        print(f"\n#### {arch.upper()} decode update, 32 value heads, d_k = d_v = 128\n")
        print("| kernel | " + " | ".join(f"B={b}" for b in batches) + " |")
        print("|---|" + "---|" * len(batches))
        fp32_names = [f for f in fmts if f == "fp32" or f.startswith("fla:")]
        for f in fmts:
            cells = []
            for b in batches:
                if (arch, f, b) not in res:
                    cells.append("-")
                    continue
                us, sb = res[(arch, f, b)]
                bw = sb / (us * 1e-6)
                cell = f"{us:.1f} us, {bw / 1e12:.2f} TB/s"
                if copy_bw:
                    cell += f" ({100 * bw / copy_bw:.0f}%)"
                best = min((res[(arch, g, b)][0] for g in fp32_names if (arch, g, b) in res), default=None)
                if best and f not in fp32_names:
                    cell += f", {best / us:.2f}x"
                cells.append(cell)
            print(f"| {f} | " + " | ".join(cells) + " |")
    if snaps:
        print("\n#### Snapshot / restore (slot copies of the packed bytes)\n")
        print("| format | " + " | ".join(f"B={b}" for b in batches) + " |")
        print("|---|" + "---|" * len(batches))
        for f in dict.fromkeys(f for (f, _) in snaps):
            cells = []
            for b in batches:
                if (f, b) not in snaps:
                    cells.append("-")
                    continue
                us, by = snaps[(f, b)]
                bw = by / (us * 1e-6)
                cell = f"{us:.1f} us, {bw / 1e12:.2f} TB/s"
                if copy_bw:
                    cell += f" ({100 * bw / copy_bw:.0f}%)"
                cells.append(cell)
            print(f"| {f} | " + " | ".join(cells) + " |")
    if copy_bw:
        print(f"\nCopy bandwidth (cudaMemcpy D2D, 1 GiB, read + write): {copy_bw / 1e12:.3f} TB/s.")


if __name__ == "__main__":
    main()
