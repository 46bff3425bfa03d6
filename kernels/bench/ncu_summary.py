"""Summary of an ncu SASS source export (quick_device.sh PROFILE=...).

    python3 kernels/bench/ncu_summary.py damp_sass.csv [N]

Prints the executed instructions, the instruction mix by opcode, the warp
stall reasons in percent of samples and, with N, the N instructions with the
most stall samples (address, source, top stall reason).
"""
import collections
import csv
import re
import sys


def num(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    rows = list(csv.reader(open(sys.argv[1])))
    header = rows[1]
    ix = {h: i for i, h in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    ops = collections.Counter()
    stall_total = collections.Counter()
    items = []
    total = 0.0
    for r in rows[2:]:
        if len(r) < len(header):
            continue
        executed = num(r[ix["Instructions Executed"]])
        source = r[ix["Source"]].strip()
        op = re.sub(r"^@!?U?P\w+\s+", "", source).split(" ")[0].split(".")[0]
        ops[op] += executed
        total += executed
        per = {s: num(r[ix[s]]) for s in stalls}
        for s, v in per.items():
            stall_total[s] += v
        items.append((num(r[ix["Warp Stall Sampling (All Samples)"]]), executed,
                      r[ix["Address"]], source, per))
    print("total executed", total)
    print("ops:", [(k, int(v)) for k, v in ops.most_common(30)])
    samples = sum(stall_total.values()) or 1.0
    print("stalls %:", [(k[6:], round(100 * v / samples, 1)) for k, v in stall_total.most_common(12)])
    if len(sys.argv) > 2:
        items.sort(key=lambda x: -x[0])
        for stall, executed, address, source, per in items[:int(sys.argv[2])]:
            top = max(per.items(), key=lambda kv: kv[1])[0][6:]
            print(int(executed), int(stall), address, source[:60], top)


if __name__ == "__main__":
    main()
