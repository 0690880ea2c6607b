"""Attention-mass recall and output error per KV head, on any device.

The metric of ``sglang_locks.evaluate`` (queries after N keys; mass of each
query head's exact attention on the tokens its KV head attends; relative L2
error of the attention output), reported per KV head instead of one mean, and
computed where the keys are (evaluate builds its masks on the CPU). The
tokens attended come from ``sparse_attention.decode_token_mask`` with every
query at position N - 1, which is evaluate's selection: the N // 16 sealed
pages, sink and last local pages forced, the unsealed tail attended. A test
checks the two agree.

Fold independent sequences or layers into the head axis to measure them in one call.
"""

from __future__ import annotations

from typing import Dict, Iterable

import torch

from sglang_locks.selectors import make_selector

from .sparse_attention import Policy, decode_token_mask


@torch.no_grad()
def recall_and_error(selector: str, keys: torch.Tensor, queries: torch.Tensor, values: torch.Tensor,
                     budgets: Iterable[int], query_chunk: int = 8, **policy_kw) -> Dict[int, Dict[str, torch.Tensor]]:
    """keys/values [N, H_kv, d], queries [M, H_q, d] -> {budget: {"recall", "rel_error": [H_kv]}} (means
    over the KV head's query heads and the M queries)."""
    n, hkv, d = keys.shape
    m, hq, _ = queries.shape
    group = hq // hkv
    keys, values, queries = keys.float(), values.float(), queries.float()
    policies = [Policy(selector, b, **policy_kw) for b in budgets]
    sel = make_selector(selector, policies[0].rank)
    sel.prepare(keys, d**-0.5)
    k_full, v_full = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    sums = {p.budget: {"recall": torch.zeros(hkv, device=keys.device), "rel_error": torch.zeros(hkv, device=keys.device)}
            for p in policies}
    for start in range(0, m, query_chunk):
        q = queries[start : start + query_chunk]
        probs = torch.softmax(torch.einsum("mhd,nhd->mhn", q, k_full) * d**-0.5, -1)
        dense = torch.einsum("mhn,nhd->mhd", probs, v_full)
        positions = torch.full((q.shape[0],), n - 1, device=keys.device)
        scores = sel.head_scores(q)
        for p in policies:
            mask = decode_token_mask(scores, positions, n, hkv, p.config).repeat_interleave(group, 1)
            kept = probs * mask
            mass = kept.sum(-1)  # [m, Hq]
            sparse = torch.einsum("mhn,nhd->mhd", kept / mass[..., None], v_full)
            err = (sparse - dense).norm(dim=-1) / dense.norm(dim=-1).clamp_min(1e-30)
            sums[p.budget]["recall"] += mass.view(-1, hkv, group).sum((0, 2))
            sums[p.budget]["rel_error"] += err.view(-1, hkv, group).sum((0, 2))
    return {b: {k: v / (m * group) for k, v in s.items()} for b, s in sums.items()}

