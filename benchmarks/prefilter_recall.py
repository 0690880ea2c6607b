"""Recall cost of the decode prefilter (--locks-prefilter F --locks-prefilter-rank R) on real text (CPU).

    python benchmarks/prefilter_recall.py --context 65000 --out benchmarks/results/prefilter_recall_64k.json

The tiny LM (benchmarks/models/tiny-llama-pycode) reads one held-out document
of --context tokens; per layer, the last --queries positions' queries meet the
keys before them. Each row is a selector's mean attention-mass recall
(sglang_locks.evaluate's measure) at a token budget: the exact page-mass
oracle, LOCKS scoring every page (the default), and the prefilter as the
decode kernels run it (scoring.locks_aggregate_torch's rule): every page
scored by its centroid and first R ranks, the F * budget best per KV head
scored in full, the budget chosen among those.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import subprocess
import sys

import torch

from benchmarks.tiny_lm.capture_kv import capture
from benchmarks.tiny_lm.corpus import default_roots, load_corpus
from benchmarks.tiny_lm.export import load_model
from sglang_locks.config import LocksConfig
from sglang_locks.evaluate import _token_mask
from sglang_locks.kernels.aggregate_scores import aggregate_scores_torch
from sglang_locks.selection import select_pages
from sglang_locks.selectors import LocksSelector, OracleSelector

MODEL = "benchmarks/models/tiny-llama-pycode"


def locks_scores(selector: LocksSelector, q: torch.Tensor, ranks: int) -> torch.Tensor:
    """Per-head scores [M, Hq, P] from the centroid and the first ranks ranks (ranks 0: q . mu + log 16)."""
    mu, basis, coef = selector.summaries.dequantize()  # [P, H, d], [P, H, r, d], [P, H, 16, r]
    hkv = selector.summaries.num_kv_heads
    m, hq, d = q.shape
    qg = q.float().view(m, hkv, hq // hkv, d)
    qmu = torch.einsum("mhgd,phd->mhgp", qg, mu)
    if ranks == 0:
        return (qmu * selector.sm_scale + math.log(16)).flatten(1, 2)
    proj = torch.einsum("mhgd,phrd->mhgpr", qg, basis[:, :, :ranks])
    local = torch.einsum("mhgpr,phir->mhgpi", proj, coef[..., :ranks])
    return torch.logsumexp((qmu[..., None] + local) * selector.sm_scale, -1).flatten(1, 2)


def prefilter_selection(full, estimate, n, hkv, cfg: LocksConfig) -> torch.Tensor:
    """Selected logical pages [M * H_kv, k] of the prefiltered rule (scoring.locks_aggregate_torch's)."""
    m, hq, p = full.shape
    lens = torch.full((m,), n, dtype=torch.long)
    forced = (cfg.sink_pages, cfg.local_pages, cfg.gqa_aggregation)
    keep = torch.zeros(m * hkv, p, dtype=torch.bool)
    keep.scatter_(1, select_pages(aggregate_scores_torch(estimate, lens, hkv, *forced), cfg.candidate_pages), True)
    keep = keep.view(m, hkv, p)
    per_head = keep[:, :, None].expand(m, hkv, hq // hkv, p).reshape(m, hq, p)
    agg = aggregate_scores_torch(torch.where(per_head, full, estimate), lens, hkv, *forced)
    return select_pages(torch.where(keep, agg, torch.full_like(agg, float("-inf"))), cfg.budget_pages)


def recall(probs, sel, n, budget_pages, hkv, group) -> torch.Tensor:
    mask = _token_mask(sel, n, budget_pages, hkv, probs.shape[0]).repeat_interleave(group, 1)
    return (probs * mask).sum(-1).flatten()


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
    settings = [(f, r) for f in map(int, args.prefilters.split(",")) for r in map(int, args.ranks.split(","))]
    sums = {}
    for li, layer in enumerate(layers):
        keys, q = layer["keys"][0].float(), layer["queries"][0].float()
        n, hkv, d = keys.shape
        group = q.shape[1] // hkv
        probs = torch.softmax(torch.einsum("mhd,nhd->mhn", q, keys.repeat_interleave(group, 1)) * d**-0.5, -1)
        locks = LocksSelector()
        locks.prepare(keys, d**-0.5)
        oracle = OracleSelector()
        oracle.prepare(keys, d**-0.5)
        scores = {"oracle": oracle.head_scores(q), "locks": locks.head_scores(q)}
        estimates = {r: locks_scores(locks, q, r) for r in {r for _, r in settings}}
        lens = torch.full((q.shape[0],), n, dtype=torch.long)
        for b in budgets:
            cfg = LocksConfig(token_budget=b)
            for name, s in scores.items():
                agg = aggregate_scores_torch(s, lens, hkv, cfg.sink_pages, cfg.local_pages, cfg.gqa_aggregation)
                sums.setdefault((name, b, 0, None), []).append(recall(probs, select_pages(agg, cfg.budget_pages), n,
                                                                      cfg.budget_pages, hkv, group))
            for f, r in settings:
                cfg = LocksConfig(token_budget=b, prefilter=f, prefilter_rank=r)
                sel = prefilter_selection(scores["locks"], estimates[r], n, hkv, cfg)
                sums.setdefault(("locks-prefilter", b, f, r), []).append(recall(probs, sel, n, cfg.budget_pages, hkv,
                                                                                group))
        print(f"layer {li} done", flush=True)
    rows = [{"selector": s, "budget": b, "prefilter": f, "prefilter_rank": r,
             "recall": torch.cat(v).mean().item()} for (s, b, f, r), v in sums.items()]
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
