"""Sum an ncu SASS source page (CSV on stdin) by warp-stall reason, and by opcode (its top reasons):

    ncu --import rep.ncu-rep --page source --csv --print-source sass | python3 benchmarks/trials/ncu_stalls.py
"""
import csv, sys, collections
rows = list(csv.reader(sys.stdin))
hdr_i = next(i for i, r in enumerate(rows) if any("Source" == c for c in r))
hdr = rows[hdr_i]
body = rows[hdr_i + 1:]
src = hdr.index("Source")
stall_cols = [i for i, h in enumerate(hdr) if h.startswith("stall_") or "Stall" in h or "Warp Stall Sampling" in h]
tot = collections.Counter()
by_op = collections.defaultdict(collections.Counter)
def num(x):
    try: return float(x)
    except ValueError: return 0.0
for r in body:
    if len(r) <= max(stall_cols, default=0):
        continue
    op = r[src].strip().split()
    op = [t for t in op if not t.startswith("@")]
    op = op[0].split(".")[0] if op else "?"
    for i in stall_cols:
        v = num(r[i])
        if v:
            tot[hdr[i]] += v
            by_op[op][hdr[i]] += v
print("total:", tot.most_common(25))
for op, c in sorted(by_op.items(), key=lambda kv: -sum(kv[1].values()))[:25]:
    print(op, int(sum(c.values())), c.most_common(4))
