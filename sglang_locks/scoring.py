"""score_pages: one aggregated LOCKS score per (request, KV head, sealed page)."""

from __future__ import annotations

import torch

from .config import LocksConfig
from .kernels._triton import triton_usable
from .kernels.aggregate_scores import aggregate_scores_torch, aggregate_scores_triton
from .kernels.score_pages import score_pages_torch, score_pages_triton
from .summaries import PageSummaries


def score_pages(
    q: torch.Tensor,
    summaries: PageSummaries,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    max_pages: int,
    sm_scale: float,
    config: LocksConfig,
) -> torch.Tensor:
    """Aggregated scores [B, H_kv, max_pages]: +inf for forced pages, -inf past the sealed ones.

    q [B, Hq, d] is one decode query per request; seq_lens counts the tokens in
    the cache (the unsealed tail included). Triton on CUDA (or under
    TRITON_INTERPRET=1), torch otherwise.
    """
    hq, hkv = q.shape[1], summaries.num_kv_heads
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    args = (q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale)
    forced = (config.sink_pages, config.local_pages, config.gqa_aggregation)
    if triton_usable(q.device):
        scores, part_max, part_sum = score_pages_triton(*args)
        return aggregate_scores_triton(scores, part_max, part_sum, seq_lens, hkv, *forced)
    return aggregate_scores_torch(score_pages_torch(*args), seq_lens, hkv, *forced)
