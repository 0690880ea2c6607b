"""Selector evaluation on captured keys.

    python -m sglang_locks.evaluate --kv FILE.pt --budget 64,256,512,2048 \
        [--selectors locks,quest,shared,oracle] [--kv-cache-dtype fp8_e4m3 [--k-scale S]] [--json]

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
import math
import os
import sys
from typing import Dict, Iterable, List, Optional

import torch

from .config import PAGE_SIZE, LocksConfig, SUMMARY_PRECISIONS, GQA_AGGREGATIONS
from .kernels.aggregate_scores import aggregate_scores_torch
from .selection import select_pages
from .selectors import SELECTOR_SPECS, make_selector


class InputError(ValueError):
    """Input the tool refuses: main() prints it as one line and exits 2."""


_LAYOUT = "a dict of keys [N, H_kv, d], queries [M, H_q, d] and optionally values [N, H_kv, d]"


def load_kv(path: str) -> Dict[str, Optional[torch.Tensor]]:
    """FILE.pt's keys, queries and values, checked by check_kv; InputError naming the file otherwise."""
    where = f"--kv {path}"
    try:
        empty = os.path.getsize(path) == 0
        data = None if empty else torch.load(path, map_location="cpu", weights_only=True)
    except OSError as e:
        raise InputError(f"{where}: cannot read it: {e.strerror or e}") from e
    except Exception as e:  # foreign bytes fail torch.load in many types (KeyError, EOFError, UnpicklingError, ...)
        raise InputError(f"{where}: not a torch.save file of tensors ({type(e).__name__}); need {_LAYOUT}") from e
    if empty:
        raise InputError(f"{where}: empty file; need {_LAYOUT}")
    return check_kv(data, where)


def _describe(x) -> str:
    return f"{x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


def check_kv(data, where: str = "data") -> Dict[str, Optional[torch.Tensor]]:
    """keys, queries and values of data, or InputError naming the field and what it must be: nothing
    evaluate reports may come from an empty or non-finite input."""
    if not isinstance(data, dict):
        raise InputError(f"{where}: holds a {type(data).__name__}; need {_LAYOUT}")
    for name in ("keys", "queries"):
        if name not in data:
            raise InputError(f"{where}: missing '{name}'; need {_LAYOUT}")
    fields = {name: data.get(name) for name in ("keys", "queries", "values")}
    for name, x in fields.items():
        if x is None and name == "values":
            continue
        if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() == 3):
            raise InputError(f"{where}: {name} must be a 3-dim floating-point tensor, got {_describe(x)}")
    keys, queries, values = fields.values()
    n, hkv, d = keys.shape
    if min(n, hkv, d) < 1:
        raise InputError(f"{where}: keys [N, H_kv, d] need N >= 1 tokens, H_kv >= 1 heads and d >= 1, "
                         f"got shape {tuple(keys.shape)}")
    m, hq, dq = queries.shape
    if m < 1 or hq < hkv or hq % hkv or dq != d:
        raise InputError(f"{where}: queries [M, H_q, d] need M >= 1 queries, H_q a positive multiple of the keys' "
                         f"H_kv = {hkv} and the keys' d = {d}, got shape {tuple(queries.shape)}")
    if values is not None and values.shape != keys.shape:
        raise InputError(f"{where}: values must have the keys' shape {tuple(keys.shape)}, got {tuple(values.shape)}")
    for name, x in fields.items():
        bad = 0 if x is None else x.numel() - int(torch.isfinite(x).sum())
        if bad:
            raise InputError(f"{where}: {name} must be finite, got {bad} NaN or Inf of {x.numel()} entries")
    return fields


def _configs(budgets: Iterable[int], **config) -> List[LocksConfig]:
    budgets = list(budgets)
    if not budgets:
        raise InputError("--budget: need at least one token budget, e.g. 64,256,512,2048")
    try:
        return [LocksConfig(token_budget=b, **config) for b in budgets]
    except ValueError as e:  # its message names the field and its range
        raise InputError(str(e)) from e


def _selectors(specs: Iterable[str], rank: int, precision: str) -> list:
    specs = list(specs)
    if not specs:
        raise InputError(f"--selectors: need at least one of {SELECTOR_SPECS}")
    try:
        return [make_selector(spec, rank, precision) for spec in specs]
    except ValueError as e:
        raise InputError(str(e)) from e


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
    """One row per selector and budget; InputError (a ValueError) for anything check_kv, LocksConfig or
    make_selector refuses, before any selector runs."""
    keys, queries, values = check_kv(data).values()
    keys, queries = keys.float(), queries.float()
    configs = _configs(budgets, rank=rank, sink_pages=sink_pages, local_pages=local_pages,
                       summary_precision=precision, gqa_aggregation=aggregation)
    selector_objs = _selectors(selectors, rank, precision)
    n, hkv, d = keys.shape
    hq = queries.shape[1]
    group = hq // hkv
    sm_scale = d**-0.5
    k_full = keys.repeat_interleave(group, 1)  # [N, Hq, d]
    v_full = None if values is None else values.float().repeat_interleave(group, 1)
    rows = []
    while selector_objs:
        sel_obj = selector_objs.pop(0)  # dropped after its rows: a prepared selector holds as much as the keys
        try:
            sel_obj.prepare(keys, sm_scale)
        except ValueError as e:  # keys this selector cannot summarise (LOCKS: an odd d)
            raise InputError(f"selector {sel_obj.name!r}: {e}") from e
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
            figures = {"recall": torch.cat(recall[b]).mean().item()}
            if error[b]:
                figures["rel_error"] = torch.cat(error[b]).mean().item()
            if not all(map(math.isfinite, figures.values())):
                shown = ", ".join(f"{k} {v}" for k, v in figures.items())
                raise InputError(f"selector {sel_obj.name!r} at budget {b}: {shown} from finite input: attention "
                                 f"overflows float32 (scale keys, queries or values down)")
            rows.append({"selector": sel_obj.name, "budget": b, "recall": figures["recall"],
                         "rel_error": figures.get("rel_error")})
    return rows


KV_CACHE_DTYPES = ("bf16", "fp16", "fp8_e4m3")
_TORCH_KV_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8_e4m3": torch.float8_e4m3fn}


def as_cached(data: Dict[str, Optional[torch.Tensor]], kv_cache_dtype: str, k_scale: float = 1.0,
              v_scale: float = 1.0) -> Dict[str, Optional[torch.Tensor]]:
    """The keys and values as a server's KV cache of kv_cache_dtype holds them, read back as float32: an fp8
    cache stores key / k_scale and value / v_scale (SGLang's --kv-cache-dtype fp8_e4m3, with the layer's
    scales: 1.0 without checkpoint scales). Queries are left as they are. Both the summaries and the exact
    attention the recall is measured against then see the cached keys, as in that server."""
    if kv_cache_dtype not in _TORCH_KV_DTYPES:
        raise InputError(f"--kv-cache-dtype {kv_cache_dtype}: one of {', '.join(KV_CACHE_DTYPES)}")
    for name, scale in (("--k-scale", k_scale), ("--v-scale", v_scale)):
        if not (math.isfinite(scale) and scale > 0):
            raise InputError(f"{name} must be a positive finite number, got {scale}")
    dtype = _TORCH_KV_DTYPES[kv_cache_dtype]

    def cached(x, scale):
        return None if x is None else ((x.float() / scale).to(dtype).float() * scale)

    return dict(data, keys=cached(data["keys"], k_scale), values=cached(data.get("values"), v_scale))


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
                    help=f"comma-separated: {SELECTOR_SPECS} (locks-prefilter:F[:R]: the decode prefilter, "
                         "--locks-prefilter F --locks-prefilter-rank R)")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--precision", default="int8-int4-int8", choices=SUMMARY_PRECISIONS)
    ap.add_argument("--sink-pages", type=int, default=1)
    ap.add_argument("--local-pages", type=int, default=1)
    ap.add_argument("--aggregation", default="mass", choices=GQA_AGGREGATIONS)
    ap.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES,
                    help="evaluate on the keys and values as a KV cache of this dtype holds them (default: as stored)")
    ap.add_argument("--k-scale", type=float, default=1.0, help="with --kv-cache-dtype fp8_e4m3: the layer's k scale")
    ap.add_argument("--v-scale", type=float, default=1.0, help="with --kv-cache-dtype fp8_e4m3: the layer's v scale")
    ap.add_argument("--json", action="store_true", help="print one JSON list of rows")
    args = ap.parse_args(argv)
    try:
        data = load_kv(args.kv)
        if args.kv_cache_dtype:
            data = as_cached(data, args.kv_cache_dtype, args.k_scale, args.v_scale)
        rows = evaluate(data, args.budget, [s.strip() for s in args.selectors.split(",") if s.strip()],
                        args.rank, args.precision, args.sink_pages, args.local_pages, args.aggregation)
    except InputError as e:  # one line: ap.error would print the usage above it
        ap.exit(2, f"{ap.prog}: error: {e}\n")
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
