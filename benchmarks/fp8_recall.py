"""What an fp8 KV cache costs LOCKS's selection: recall with the keys as a bf16 cache holds them against the keys as
SGLang's --kv-cache-dtype fp8_e4m3 holds them, on real text (CPU).

    python benchmarks/fp8_recall.py --out benchmarks/results/fp8_recall.json [--context 16384 --docs 2]

The tiny LM (benchmarks/models/tiny-llama-pycode) reads --docs held-out documents of --context tokens; per layer,
the last --queries positions' queries meet the keys before them (benchmarks/tiny_lm/capture_kv.py). For each KV
cache dtype the keys and values are rounded as that cache stores them (sglang_locks.evaluate.as_cached: fp8 holds
key / k_scale, with k_scale 1.0 as SGLang uses without checkpoint scales) and sglang_locks.evaluate measures each
selector's mean attention-mass recall and output error at each budget, against exact attention over those same
cached keys, as each server attends. Rows: per (dtype, selector, budget), the mean over layers and documents
(equal numbers of (query, head) pairs each); `fp8_minus_bf16_points`: the recall difference in points.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from benchmarks.tiny_lm.capture_kv import capture  # noqa: E402
from benchmarks.tiny_lm.corpus import default_roots, load_corpus  # noqa: E402
from benchmarks.tiny_lm.export import load_model  # noqa: E402
from e2e_decode import header  # noqa: E402
from sglang_locks.evaluate import as_cached, evaluate  # noqa: E402

MODEL = "benchmarks/models/tiny-llama-pycode"
DTYPES = ("bf16", "fp8_e4m3")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--docs", type=int, default=2)
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--budgets", default="256,1024,2048")
    ap.add_argument("--selectors", default="locks,quest,oracle")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model = load_model(os.path.join(ROOT, MODEL), torch.device("cpu"), torch.float32)
    docs = load_corpus(default_roots([])).held_out_documents(args.context, args.docs)
    budgets = [int(b) for b in args.budgets.split(",")]
    selectors = args.selectors.split(",")
    per_case = {}
    for doc in docs:
        for li, layer in enumerate(capture(model, doc["ids"][None], args.queries)):
            data = {name: t[0] for name, t in layer.items()}
            for dtype in DTYPES:
                for row in evaluate(as_cached(data, dtype), budgets, selectors):
                    per_case.setdefault((dtype, row["selector"], row["budget"]), []).append(row)
            print(f"fp8_recall: {doc['package']}@{doc['offset']} layer {li} done", flush=True)
    rows = [{"kv_cache_dtype": dtype, "selector": sel, "budget": budget, "samples": len(rs),
             "recall": sum(r["recall"] for r in rs) / len(rs), "rel_error": sum(r["rel_error"] for r in rs) / len(rs)}
            for (dtype, sel, budget), rs in per_case.items()]
    recall = {(r["kv_cache_dtype"], r["selector"], r["budget"]): r["recall"] for r in rows}
    for r in rows:
        if r["kv_cache_dtype"] == "fp8_e4m3":
            r["fp8_minus_bf16_points"] = 100 * (r["recall"] - recall[("bf16", r["selector"], r["budget"])])
    out = {**header(argv), "gpu": "CPU (torch references)",
           "command": " ".join(["python", "benchmarks/fp8_recall.py", *argv]), "model": MODEL, "context": args.context, "queries_per_layer": args.queries,
           "documents": [f"{d['package']}@{d['offset']}" for d in docs], "k_scale": 1.0, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    for r in rows:
        print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
