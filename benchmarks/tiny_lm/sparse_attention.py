"""Decode-position attention restricted to a selector's pages: the model-level counterpart of
``sglang_locks.evaluate`` (which scores queries against a fixed set of keys).

Per decode query at position t (attending keys 0..t) and KV head, the attended
tokens are what LOCKS decode attends: the pages chosen among the t+1 keys'
sealed pages (the selector's per-page scores over the sealed pages only, GQA
aggregation with sink/local pages forced, top budget_pages, all pages when they
fit) plus the unsealed tail. Scoring, aggregation and top-k are
``sglang_locks``' own (selectors.make_selector, aggregate_scores_torch,
select_pages); this module only builds token masks and attends with them.

Batches are folded into heads (selectors treat KV heads independently), so B
sequences of one length are selected and attended in one call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch

from sglang_locks.config import PAGE_SIZE, LocksConfig
from sglang_locks.kernels.aggregate_scores import aggregate_scores_torch
from sglang_locks.selection import select_pages
from sglang_locks.selectors import make_selector

DENSE = "dense"


@dataclass(frozen=True)
class Policy:
    """A selector spec (as sglang_locks.evaluate's --selectors, or 'dense') and its LOCKS config."""

    selector: str
    budget: int = 2048
    rank: int = 8
    sink_pages: int = 1
    local_pages: int = 1
    aggregation: str = "mass"

    @property
    def config(self) -> LocksConfig:
        return LocksConfig(token_budget=self.budget, rank=self.rank, sink_pages=self.sink_pages,
                           local_pages=self.local_pages, gqa_aggregation=self.aggregation)

    @property
    def label(self) -> str:
        return DENSE if self.selector == DENSE else f"{self.selector}@{self.budget}"


def decode_token_mask(scores: torch.Tensor, positions: torch.Tensor, n_keys: int, num_kv_heads: int,
                      cfg: LocksConfig) -> torch.Tensor:
    """Tokens attended per (query, KV head): bool [M, H_kv, n_keys].

    ``scores`` [M, H_q, P] are a selector's head_scores of queries at
    ``positions`` [M], from a selector prepared on keys that cover every page
    sealed before the last query (pages beyond a query's own sealed pages are
    excluded for that query).
    """
    m, _, n_pages = scores.shape
    device = scores.device
    seq_lens = positions + 1
    n_sealed = seq_lens // PAGE_SIZE
    if int(n_sealed.max()) > n_pages:
        raise ValueError(f"selector covers {n_pages} pages, queries need {int(n_sealed.max())}")
    page_ids = torch.arange(n_pages, device=device)
    scores = scores.masked_fill(page_ids >= n_sealed[:, None, None], float("-inf"))
    agg = aggregate_scores_torch(scores, seq_lens, num_kv_heads, cfg.sink_pages, cfg.local_pages, cfg.gqa_aggregation)
    # Valid pages score finite or +inf (forced), the rest -inf: when a query's sealed pages
    # fit in the budget, top-k takes them all (dense), as LOCKS does.
    chosen = select_pages(agg, cfg.budget_pages).view(m, num_kv_heads, -1)
    pages = torch.zeros(m, num_kv_heads, n_pages, dtype=torch.bool, device=device).scatter_(2, chosen, True)
    pages &= page_ids < n_sealed[:, None, None]
    token_ids = torch.arange(n_keys, device=device)
    in_pages = torch.zeros(m, num_kv_heads, n_keys, dtype=torch.bool, device=device)
    in_pages[..., : n_pages * PAGE_SIZE] = pages.repeat_interleave(PAGE_SIZE, -1)[..., :n_keys]
    sealed = token_ids[None, :] < (n_sealed * PAGE_SIZE)[:, None]  # [M, n_keys]
    tail = token_ids[None, :] <= positions[:, None]
    return torch.where(sealed[:, None], in_pages, tail[:, None])


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [M, H_q, d], k/v [N, H_kv, d], mask [M, H_kv, N] -> float32 [M, H_q, d]."""
    group = q.shape[1] // k.shape[1]
    logits = torch.einsum("mhd,nhd->mhn", q.float(), k.float().repeat_interleave(group, 1)) * q.shape[-1] ** -0.5
    logits = logits.masked_fill(~mask.repeat_interleave(group, 1), float("-inf"))
    return torch.einsum("mhn,nhd->mhd", torch.softmax(logits, -1), v.float().repeat_interleave(group, 1))


def causal_mask(positions: torch.Tensor, n_keys: int, num_kv_heads: int) -> torch.Tensor:
    keep = torch.arange(n_keys, device=positions.device)[None, :] <= positions[:, None]
    return keep[:, None].expand(-1, num_kv_heads, -1)


class SparseDecodeAttend:
    """Model ``attend`` callback: every query of the call is a decode position under ``policy``.

    Selectors are prepared per layer on the keys of the pages sealed before the
    call's last query. Preparations over pages that all lie in the first
    ``shared_prefix`` positions (e.g. a prompt decoded under several budgets) are
    kept in ``prepared`` (pass the same dict to reuse them across calls).
    """

    def __init__(self, policy: Policy, shared_prefix: int = 0, prepared: Optional[Dict] = None,
                 query_chunk: int = 64):
        self.policy, self.cfg = policy, policy.config
        self.shared_prefix = shared_prefix
        self.prepared = {} if prepared is None else prepared
        self.query_chunk = query_chunk

    def _selector(self, layer: int, keys: torch.Tensor, n_sealed: int):
        key = (self.policy.selector, self.policy.rank, layer, n_sealed)
        if key in self.prepared:
            return self.prepared[key]
        sel = make_selector(self.policy.selector, self.policy.rank)
        sel.prepare(keys[: n_sealed * PAGE_SIZE], keys.shape[-1] ** -0.5)
        if n_sealed * PAGE_SIZE <= self.shared_prefix:
            self.prepared[key] = sel
        return sel

    def __call__(self, layer: int, q, k, v, q_start: int) -> torch.Tensor:
        b, hq, tq, d = q.shape
        hkv, tk = k.shape[1], k.shape[2]
        qf = q.permute(2, 0, 1, 3).reshape(tq, b * hq, d)  # batch folded into heads
        kf = k.permute(2, 0, 1, 3).reshape(tk, b * hkv, d)
        vf = v.permute(2, 0, 1, 3).reshape(tk, b * hkv, d)
        positions = torch.arange(q_start, q_start + tq, device=q.device)
        dense = self.policy.selector == DENSE
        n_sealed = (q_start + tq) // PAGE_SIZE
        sel = None if dense or n_sealed == 0 else self._selector(layer, kf, n_sealed)
        out = []
        for i in range(0, tq, self.query_chunk):
            qc, pc = qf[i : i + self.query_chunk], positions[i : i + self.query_chunk]
            if sel is None:
                mask = causal_mask(pc, tk, b * hkv)
            else:
                mask = decode_token_mask(sel.head_scores(qc), pc, tk, b * hkv, self.cfg)
            out.append(masked_attention(qc, kf, vf, mask))
        return torch.cat(out).view(tq, b, hq, d).permute(1, 2, 0, 3).to(q.dtype)
