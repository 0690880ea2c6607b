"""Selector recall on the structured-key generator, per GQA aggregation (CPU, torch references).

    python benchmarks/selector_eval.py --out benchmarks/results/selector_eval_structured.json

The generator (sglang_locks.synthetic) builds page-local low-rank keys by
construction: these numbers check that LOCKS reaches its oracle and how the
GQA aggregations compare, not how selectors do on real models (issue 4).
"""

import argparse
import datetime
import json
import os
import subprocess

from sglang_locks.evaluate import evaluate
from sglang_locks.synthetic import structured_kv

BUDGETS = [64, 128, 256, 512, 1024, 2048]
SELECTORS = ["locks", "locks:fp32", "quest", "shared", "shared:32", "oracle"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=16384)
    args = ap.parse_args()
    rows = []
    for group in (4, 16):
        data = structured_kv(tokens=args.tokens, kv_heads=2, group=group, queries=16, seed=group)
        for agg in ("mass", "max", "logsumexp"):
            for r in evaluate(data, BUDGETS, SELECTORS, aggregation=agg):
                rows.append({"group": group, "aggregation": agg, **r})
                print(rows[-1], flush=True)
    # GIT_REV first: the device machine's copy of the checkout can carry stale git metadata.
    git = os.environ.get("GIT_REV") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                      text=True).stdout.strip()
    header = {"machine": "CPU (torch references)", "git": git,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": f"python benchmarks/selector_eval.py --out {args.out} --tokens {args.tokens}",
              "data": f"sglang_locks.synthetic.structured_kv(tokens={args.tokens}, kv_heads=2, group=G, queries=16, seed=G)"}
    json.dump({**header, "rows": rows}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
