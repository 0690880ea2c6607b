"""Recall cost of the decode prefilter (--locks-prefilter F --locks-prefilter-rank R) on real text (CPU).

    python benchmarks/prefilter_recall.py --context 65000 --out benchmarks/results/prefilter_recall_65000.json

The tiny LM (benchmarks/models/tiny-llama-pycode) reads one held-out document
of --context tokens; per layer, the last --queries positions' queries meet the
keys before them. Each row is a selector's mean attention-mass recall
(sglang_locks.evaluate's measure) at a token budget: the exact page-mass
oracle, LOCKS scoring every page (the default), and the prefilter as the
decode kernels run it (the evaluation tool's locks-prefilter:F:R selector,
scoring.prefiltered_aggregate_torch's rule): every page scored by its
centroid and first R ranks, the F * budget best per KV head scored in full,
the budget chosen among those.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys

import torch

from benchmarks.tiny_lm.capture_kv import capture
from benchmarks.tiny_lm.corpus import default_roots, load_corpus
from benchmarks.tiny_lm.export import load_model
from sglang_locks.evaluate import evaluate

MODEL = "benchmarks/models/tiny-llama-pycode"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--queries", type=int, default=16)
    ap.add_argument("--budgets", default="512,1024,2048")
    ap.add_argument("--prefilters", default="4,8,16", help="candidate pages per budget page")
    ap.add_argument("--ranks", default="0,1,2", help="ranks of the prefilter's estimate")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = load_model(MODEL, torch.device("cpu"), torch.float32)
    doc = load_corpus(default_roots([])).held_out_documents(args.context + 1, 1)[0]
    layers = capture(model, doc["ids"][None, : args.context], args.queries)
    budgets = [int(b) for b in args.budgets.split(",")]
    selectors = ["oracle", "locks"] + [f"locks-prefilter:{f}:{r}" for f in args.prefilters.split(",")
                                       for r in args.ranks.split(",")]
    recalls = {}
    for li, layer in enumerate(layers):
        data = {"keys": layer["keys"][0].float(), "queries": layer["queries"][0].float(), "values": None}
        for row in evaluate(data, budgets, selectors):
            recalls.setdefault((row["selector"], row["budget"]), []).append(row["recall"])
        print(f"layer {li} done", flush=True)
    rows = []
    for (name, budget), per_layer in recalls.items():  # layers hold equally many (query, head) pairs
        _, factor, rank = (name.split(":") + [0, None])[:3]
        rows.append({"selector": name.split(":")[0], "budget": budget, "prefilter": int(factor),
                     "prefilter_rank": None if rank is None else int(rank), "recall": sum(per_layer) / len(per_layer)})
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"command": " ".join(["python"] + sys.argv), "git": git, "model": MODEL, "context": args.context,
           "queries_per_layer": args.queries, "layers": len(layers), "document": f"{doc['package']}@{doc['offset']}",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    for row in rows:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
