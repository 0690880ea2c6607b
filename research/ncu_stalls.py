"""Sum an ncu SASS source page (CSV on stdin) by warp-stall reason, and by opcode (its top reasons):

    ncu --import rep.ncu-rep --page source --csv --print-source sass | python3 research/ncu_stalls.py
"""
import collections
import csv
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from score_sass import opcode  # noqa: E402


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


rows = list(csv.reader(sys.stdin))
at = next(i for i, r in enumerate(rows) if "Source" in r)
header, body = rows[at], rows[at + 1:]
source = header.index("Source")
stalls = [i for i, h in enumerate(header) if h.startswith("stall_") or "Stall" in h]
total = collections.Counter()
by_op = collections.defaultdict(collections.Counter)
for r in body:
    if len(r) <= max(stalls, default=0) or not r[source].strip():
        continue
    op = opcode(r[source].strip())
    for i in stalls:
        v = number(r[i])
        if v:
            total[header[i]] += v
            by_op[op][header[i]] += v
print("total:", total.most_common(25))
for op, c in sorted(by_op.items(), key=lambda kv: -sum(kv[1].values()))[:25]:
    print(op, int(sum(c.values())), c.most_common(4))
