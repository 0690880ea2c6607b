"""Selector evaluation on captured keys.

    python -m sglang_locks.evaluate --kv FILE.pt --budget 64,256,512,2048 \
        [--selectors locks,quest,shared,oracle] [--json]

FILE.pt is a dict with ``keys`` [N, H_kv, d] (post-RoPE, as cached),
``queries`` [M, H_q, d] (decode queries that come after the N keys) and
optionally ``values`` [N, H_kv, d]. For every selector and budget it reports
the mean attention-mass recall (the share of each query head's exact attention
that falls on the tokens its KV head selected: sink, local and chosen pages and
the unsealed tail) and, given values, the mean relative error of the attention
output against dense attention. ``locks-prefilter:F[:R]`` is the decode
prefilter (``--locks-prefilter F --locks-prefilter-rank R``): what it costs
against ``locks`` on a model's own keys.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, Iterable, List, Optional

import torch

from .config import PAGE_SIZE, LocksConfig, SUMMARY_PRECISIONS, GQA_AGGREGATIONS
from .kernels.aggregate_scores import aggregate_scores_torch
from .selection import select_pages
from .selectors import make_selector


def load_kv(path: str) -> Dict[str, torch.Tensor]:
    data = torch.load(path, map_location="cpu", weights_only=True)
    for name in ("keys", "queries"):
        if name not in data:
            raise ValueError(f"{path}: missing '{name}' (need keys [N, H_kv, d] and queries [M, H_q, d])")
    keys, queries, values = data["keys"], data["queries"], data.get("values")
    if keys.dim() != 3 or queries.dim() != 3 or keys.shape[2] != queries.shape[2]:
        raise ValueError(f"{path}: keys must be [N, H_kv, d] and queries [M, H_q, d] with one d")
    if queries.shape[1] % keys.shape[1]:
        raise ValueError(f"{path}: query heads {queries.shape[1]} not a multiple of KV heads {keys.shape[1]}")
    if values is not None and values.shape != keys.shape:
        raise ValueError(f"{path}: values must have the shape of keys {tuple(keys.shape)}")
    return {"keys": keys, "queries": queries, "values": values}


def _token_mask(sel: torch.Tensor, n_tokens: int, budget_pages: int, hkv: int, m: int) -> torch.Tensor:
    """[M, H_kv, N] bool of the tokens each (query, KV head) attends."""
    n_sealed = n_tokens // PAGE_SIZE
    if n_sealed <= budget_pages:
        return torch.ones(m, hkv, n_tokens, dtype=torch.bool)
    pages = torch.zeros(m * hkv, n_sealed, dtype=torch.bool)
    pages.scatter_(1, sel, True)
    tokens = pages.repeat_interleave(PAGE_SIZE, 1)
    tail = torch.ones(m * hkv, n_tokens - n_sealed * PAGE_SIZE, dtype=torch.bool)
    return torch.cat([tokens, tail], 1).view(m, hkv, n_tokens)


def evaluate(
    data: Dict[str, torch.Tensor],
    budgets: Iterable[int],
    selectors: Iterable[str] = ("locks", "quest", "shared", "oracle"),
    rank: int = 8,
    precision: str = "int8-int4-int8",
    sink_pages: int = 1,
    local_pages: int = 1,
    aggregation: str = "mass",
    query_chunk: int = 4,
) -> List[dict]:
    keys, queries, values = data["keys"].float(), data["queries"].float(), data.get("values")
    n, hkv, d = keys.shape
    hq = queries.shape[1]
    group = hq // hkv
    sm_scale = d**-0.5
    configs = [
        LocksConfig(token_budget=b, rank=rank, sink_pages=sink_pages, local_pages=local_pages,
                    summary_precision=precision, gqa_aggregation=aggregation)
        for b in budgets
    ]
    k_full = keys.repeat_interleave(group, 1)  # [N, Hq, d]
    v_full = None if values is None else values.float().repeat_interleave(group, 1)
    rows = []
    for spec in selectors:
        sel_obj = make_selector(spec, rank, precision)
        sel_obj.prepare(keys, sm_scale)
        recall = {c.token_budget: [] for c in configs}
        error = {c.token_budget: [] for c in configs}
        for start in range(0, queries.shape[0], query_chunk):
            q = queries[start : start + query_chunk]
            m = q.shape[0]
            probs = torch.softmax(torch.einsum("mhd,nhd->mhn", q, k_full) * sm_scale, -1)  # [m, Hq, N]
            dense = None if v_full is None else torch.einsum("mhn,nhd->mhd", probs, v_full)
            scores = sel_obj.head_scores(q) if n >= PAGE_SIZE else None
            seq_lens = torch.full((m,), n, dtype=torch.long)
            for c in configs:
                if scores is None:
                    mask = torch.ones(m, hkv, n, dtype=torch.bool)
                elif hasattr(sel_obj, "select_pages_for"):  # a selection that depends on the budget
                    mask = _token_mask(sel_obj.select_pages_for(scores, seq_lens, c), n, c.budget_pages, hkv, m)
                else:
                    agg = aggregate_scores_torch(scores, seq_lens, hkv, c.sink_pages, c.local_pages, c.gqa_aggregation)
                    mask = _token_mask(select_pages(agg, c.budget_pages), n, c.budget_pages, hkv, m)
                mask = mask.repeat_interleave(group, 1)  # [m, Hq, N]
                kept = probs * mask
                mass = kept.sum(-1)
                recall[c.token_budget].append(mass.flatten())
                if dense is not None:
                    sparse = torch.einsum("mhn,nhd->mhd", kept / mass[..., None], v_full)
                    err = (sparse - dense).norm(dim=-1) / dense.norm(dim=-1).clamp_min(1e-30)
                    error[c.token_budget].append(err.flatten())
        for c in configs:
            b = c.token_budget
            rows.append({
                "selector": sel_obj.name,
                "budget": b,
                "recall": torch.cat(recall[b]).mean().item(),
                "rel_error": torch.cat(error[b]).mean().item() if error[b] else None,
            })
    return rows


def _parse_budgets(text: str) -> List[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--budget takes comma-separated token counts, got {text!r}")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_locks.evaluate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kv", required=True, help="torch file with keys, queries[, values]")
    ap.add_argument("--budget", type=_parse_budgets, required=True, help="token budgets, e.g. 64,256,512,2048")
    ap.add_argument("--selectors", default="locks,quest,shared,oracle",
                    help="comma-separated: locks[:fp32|bf16|int8-int4-int8], locks-prefilter:F[:R] (the decode "
                         "prefilter, --locks-prefilter F --locks-prefilter-rank R), quest, shared[:RANK], oracle")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--precision", default="int8-int4-int8", choices=SUMMARY_PRECISIONS)
    ap.add_argument("--sink-pages", type=int, default=1)
    ap.add_argument("--local-pages", type=int, default=1)
    ap.add_argument("--aggregation", default="mass", choices=GQA_AGGREGATIONS)
    ap.add_argument("--json", action="store_true", help="print one JSON list of rows")
    args = ap.parse_args(argv)
    try:
        data = load_kv(args.kv)
        rows = evaluate(data, args.budget, [s for s in args.selectors.split(",") if s], args.rank,
                        args.precision, args.sink_pages, args.local_pages, args.aggregation)
    except ValueError as e:
        ap.error(str(e))
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
    else:
        print(f"{'selector':<24}{'budget':>8}{'recall':>10}{'rel_error':>12}")
        for r in rows:
            err = "-" if r["rel_error"] is None else f"{r['rel_error']:.4f}"
            print(f"{r['selector']:<24}{r['budget']:>8}{r['recall']:>10.4f}{err:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
