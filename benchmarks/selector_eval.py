"""Selector recall on the structured-key generator (CPU, torch references).

    python benchmarks/selector_eval.py --out benchmarks/results/selector_eval_structured.json
    python benchmarks/selector_eval.py --key-rules --out benchmarks/results/selection_keys.json

The generator (sglang_locks.synthetic) builds page-local low-rank keys by
construction: these numbers check that LOCKS reaches its oracle and how the
GQA aggregations compare, not how selectors do on real models (issue 4).

--key-rules: LOCKS recall when pages are ranked as the decode kernel ranks
them (kernels/aggregate_scores.page_key: a page's share of its group's
estimated mass in steps of 1/KEY_SCALE nat over the top KEY_RANGE nats, ties
at the k-th key in page order) beside float top-k and other rules of the kind.
"""

import argparse
import datetime
import json
import math
import os
import subprocess

import torch

import sglang_locks.evaluate as evaluate_module
from sglang_locks.kernels.aggregate_scores import KEY_RANGE, KEY_SCALE
from sglang_locks.kernels.page_selection import select_pages_by_key_torch
from sglang_locks.selection import select_pages
from sglang_locks.synthetic import structured_kv

BUDGETS = [64, 128, 256, 512, 1024, 2048]
SELECTORS = ["locks", "locks:fp32", "quest", "shared", "shared:32", "oracle"]
# (step, span) in nats: the old 16-bit rule, the kernel's, two coarser ones
KEY_RULES = [(1 / 1024, 64.0), (1 / KEY_SCALE.value, KEY_RANGE.value), (1 / 8, 32.0), (1 / 4, 64.0)]


def key_rule_select(step: float, span: float, group: int):
    """select_pages ranking by the kernel's kind of key at another resolution (mass aggregation:
    a page's share of its group's mass is agg - log G)."""
    def select(agg, budget_pages):
        offset = torch.full((agg.shape[0] * agg.shape[1],), math.log(group))
        return select_pages_by_key_torch(agg, offset, budget_pages, scale=1 / step, span=span)
    return select


def aggregation_rows(data, group):
    for agg in ("mass", "max", "logsumexp"):
        for r in evaluate_module.evaluate(data, BUDGETS, SELECTORS, aggregation=agg):
            yield {"group": group, "aggregation": agg, **r}


def key_rule_rows(data, group):
    rules = [("float top-k", select_pages)] + [
        (f"1/{round(1 / step)} nat over {span:g} nats", key_rule_select(step, span, group)) for step, span in KEY_RULES]
    try:
        for name, fn in rules:
            evaluate_module.select_pages = fn  # evaluate's selection step; its scores and recall unchanged
            for r in evaluate_module.evaluate(data, BUDGETS[:-1], ["locks"], aggregation="mass"):
                yield {"group": group, "rule": name, "budget": r["budget"], "recall": r["recall"]}
    finally:
        evaluate_module.select_pages = select_pages


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--key-rules", action="store_true", help="recall under the decode kernel's key rule instead")
    args = ap.parse_args()
    rows = []
    for group in (4, 16):
        data = structured_kv(tokens=args.tokens, kv_heads=2, group=group, queries=16, seed=group)
        for row in (key_rule_rows if args.key_rules else aggregation_rows)(data, group):
            rows.append(row)
            print(row, flush=True)
    # GIT_REV first: the device machine's copy of the checkout can carry stale git metadata.
    git = os.environ.get("GIT_REV") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                      text=True).stdout.strip()
    flag = " --key-rules" if args.key_rules else ""
    header = {"machine": "CPU (torch references)", "git": git,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": f"python benchmarks/selector_eval.py{flag} --out {args.out} --tokens {args.tokens}",
              "data": f"sglang_locks.synthetic.structured_kv(tokens={args.tokens}, kv_heads=2, group=G, queries=16, seed=G)"}
    if args.key_rules:
        header["kernel_rule"] = f"1/{KEY_SCALE.value:g} nat over {KEY_RANGE.value:g} nats"
    json.dump({**header, "rows": rows}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
