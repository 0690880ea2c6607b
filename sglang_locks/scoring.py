"""LOCKS page scores as a decode step ranks them: every sealed page in full, or prefiltered.

With config.prefilter = F > 0 (and more sealed pages than M = F * budget_pages
fit), a step scores every sealed page by its centroid alone, keeps the M best
of each (request, KV head) and scores those in full; the rest keep their
centroid score, a lower bound of their full one. locks_scores_triton runs the
kernels, locks_scores_torch is their reference, score_pages aggregates either.
"""

from __future__ import annotations

import torch

from .config import LocksConfig
from .kernels._triton import triton_usable
from .kernels.aggregate_scores import aggregate_scores_torch, aggregate_scores_triton
from .kernels.score_pages import BLOCK_PAGES, CENTROID_BLOCK_PAGES, score_chunks, score_pages_torch, score_pages_triton
from .kernels.selected_indices import SelectionState, candidate_pages_triton
from .selection import select_pages
from .summaries import PageSummaries


def prefiltered(config: LocksConfig, max_pages: int) -> bool:
    """Whether steps with score buffers max_pages wide run the prefilter (below, every page is a candidate)."""
    return 0 < config.candidate_pages < max_pages


def locks_scores_triton(q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale,
                        config: LocksConfig, state: SelectionState, candidates: torch.Tensor = None,
                        score_options: dict = None):
    """Per-head scores [B, Hq, max_pages] and chunk partials, as score_pages_triton returns them.

    Prefiltered, the partials of both launches sit side by side (the centroid
    launch's first) and merge into each head's total. state: the candidate
    selection's; candidates: a contiguous [>= B * H_kv, candidate_pages] int32
    buffer (allocated when None). score_options: launch options of the full
    (or candidate) launch.
    """
    opts = dict(score_options or {})
    args = (q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale)
    if not prefiltered(config, max_pages):
        return score_pages_triton(*args, **opts)
    bsz, hq, _ = q.shape
    hkv = summaries.num_kv_heads
    rows, m = bsz * hkv, config.candidate_pages
    if candidates is None:
        candidates = torch.empty(rows, m, dtype=torch.int32, device=q.device)
    if candidates.shape[0] < rows or candidates.shape[1] != m:
        raise ValueError(f"candidates must be [>= {rows}, {m}], got {tuple(candidates.shape)}")
    candidates = candidates[:rows]
    n_centroid = score_chunks(rows, max_pages, q.device, CENTROID_BLOCK_PAGES)[1]
    n_full = score_chunks(rows, m, q.device, opts.get("block_pages") or BLOCK_PAGES, opts.get("chunk_pages"))[1]
    scores = torch.empty(bsz, hq, max_pages, dtype=torch.float32, device=q.device)
    part_max = torch.empty(bsz, hq, n_centroid + n_full, dtype=torch.float32, device=q.device)
    part_sum = torch.empty_like(part_max)
    score_pages_triton(*args, int_conversion=opts.get("int_conversion", "int8"), terms="centroid",
                       out=(scores, part_max, part_sum, 0))
    candidate_pages_triton(scores, part_max, part_sum, n_centroid, req_to_token, req_pool_indices, seq_lens,
                           candidates, hkv, config.sink_pages, config.local_pages, config.gqa_aggregation, state)
    score_pages_triton(*args, terms="candidates", candidates=candidates, out=(scores, part_max, part_sum, n_centroid),
                       **opts)
    return scores, part_max, part_sum


def locks_scores_torch(q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale,
                       config: LocksConfig) -> torch.Tensor:
    """Reference of locks_scores_triton's scores in the dtype of q (candidates by float top-k)."""
    args = (q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale)
    full = score_pages_torch(*args)
    if not prefiltered(config, max_pages):
        return full
    centroid = score_pages_torch(*args, terms="centroid")
    bsz, hq, _ = q.shape
    hkv = summaries.num_kv_heads
    agg = aggregate_scores_torch(centroid, seq_lens, hkv, config.sink_pages, config.local_pages, config.gqa_aggregation)
    keep = torch.zeros(bsz * hkv, max_pages, dtype=torch.bool, device=q.device)
    keep.scatter_(1, select_pages(agg, config.candidate_pages), True)
    keep = keep.view(bsz, hkv, 1, max_pages).expand(bsz, hkv, hq // hkv, max_pages).reshape(bsz, hq, max_pages)
    return torch.where(keep, full, centroid)


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
    args = (q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale, config)
    forced = (config.sink_pages, config.local_pages, config.gqa_aggregation)
    if triton_usable(q.device):
        state = SelectionState(q.shape[0] * hkv, q.device)
        scores, part_max, part_sum = locks_scores_triton(*args, state)
        return aggregate_scores_triton(scores, part_max, part_sum, seq_lens, hkv, *forced)
    return aggregate_scores_torch(locks_scores_torch(*args), seq_lens, hkv, *forced)
