"""LOCKS page scores as a decode step ranks them: every sealed page in full, or prefiltered.

With config.prefilter = F > 0 (and score buffers wider than M = F *
budget_pages pages), a step scores every sealed page by an estimate from its
centroid and first config.prefilter_rank ranks, keeps the M best of each
(request, KV head) as candidates, scores those in full and selects among them.
Each query head's total mass, which normalises the GQA aggregation, counts the
candidates' full scores and the other pages' estimates.
locks_scores_triton runs the kernels; locks_aggregate_torch is the reference
of what the selection ranks.
"""

from __future__ import annotations

import torch

from .config import LocksConfig
from .kernels._triton import triton_usable
from .kernels.aggregate_scores import aggregate_scores_torch, aggregate_scores_triton
from .kernels.score_pages import (BLOCK_PAGES, chunk_pages_for, estimate_block_pages, score_chunks, score_pages_torch,
                                  score_pages_triton)
from .kernels.score_pages_gluon import gluon_applies, score_pages_gluon
from .kernels.score_pages_gluon_heads import score_pages_gluon_heads
from .kernels.score_segments import OWN_TILE_ROWS, SHARED_TILE_ROWS, members_per_tile, score_segments_triton
from .kernels.page_selection import PageScores, SelectionState, candidate_pages_triton
from .selection import select_pages
from .shared_prefix import score_segments_of
from .summaries import PageSummaries


# The Gluon score kernels add up each query head's mass for the selection (launch_score_kernel's mass) from this
# many query heads per KV head: it pays at GLM-4-9B-1M's 16, not at Llama-3.1-8B's 4, where each selection program
# merges a few partials at no cost (docs/performance.md).
MASS_MIN_GROUP = 8


def prefiltered(config: LocksConfig, max_pages: int) -> bool:
    """Whether steps with score buffers max_pages wide run the prefilter (below, every page is a candidate)."""
    return 0 < config.candidate_pages < max_pages


def candidate_buffer(rows: int, config: LocksConfig, device) -> torch.Tensor:
    """The prefilter's candidates of up to rows (request, KV head) rows: [2, rows, M] int32, logical pages then
    first slots (candidate_pages_triton)."""
    return torch.zeros(2, rows, config.candidate_pages, dtype=torch.int32, device=device)


def full_score_kernel(q, summaries, options: dict) -> str:
    """The kernel score_pages_full launches with these options: "gluon" or "triton"."""
    kernel = options.get("kernel")
    if kernel is None:
        gluon = gluon_applies(q, summaries) and not options.keys() - {"chunk_pages", "out", "mass"}
        kernel = "gluon" if gluon else "triton"
    if kernel not in ("gluon", "triton"):
        raise ValueError(f"kernel must be 'gluon' or 'triton', got {kernel!r}")
    return kernel


def score_pages_full(q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale, **options):
    """Every sealed page scored in full: score_pages_gluon where it applies (gluon_applies: int8-int4-int8
    summaries of rank 8 on a GPU; 1.3-1.5x faster on the H200; at 16 query heads per KV head its heads-on-rows
    form, score_pages_gluon_heads, 1.1-1.4x faster again), score_pages_triton otherwise. options: kernel="gluon" or
    "triton" to choose, chunk_pages and out (either kernel's), mass (the Gluon kernels': launch_score_kernel), or
    score_pages_triton's other launch options (which choose it)."""
    kernel = full_score_kernel(q, summaries, options)
    options.pop("kernel", None)
    args = (q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale)
    if kernel == "gluon":
        heads_on_rows = q.shape[1] == 16 * summaries.num_kv_heads
        return (score_pages_gluon_heads if heads_on_rows else score_pages_gluon)(*args, **options)
    return score_pages_triton(*args, **options)


def score_pages_shared(q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale, runs,
                       chunk_pages: int = None):
    """score_pages_full's (scores [B, Hq, max_pages], part_max, part_sum) with each group's shared run scored once
    for all its members (runs: shared_prefix.shared_runs of the batch) and each request's other pages on their
    own: two score_segments launches, whose chunk partials sit side by side (chunks neither wrote: -inf, 0).
    chunk_pages: pages per program of both (default: each launch's programs fill the GPU, the shared one's as if
    the whole batch were one group)."""
    bsz, hq, _ = q.shape
    hkv = summaries.num_kv_heads
    shared, own = score_segments_of(runs, seq_lens, max_pages)
    member_blocks = -(-bsz // members_per_tile(hq // hkv, SHARED_TILE_ROWS))
    shared_chunk = chunk_pages or chunk_pages_for(hkv * member_blocks, max_pages, q.device)
    own_chunk = chunk_pages or chunk_pages_for(bsz * hkv, max_pages, q.device)
    n_shared, n_own = (max(1, -(-max_pages // c)) for c in (shared_chunk, own_chunk))
    scores = torch.empty(bsz, hq, max_pages, dtype=torch.float32, device=q.device)
    part_max = torch.full((bsz, hq, n_shared + n_own), float("-inf"), dtype=torch.float32, device=q.device)
    part_sum = torch.zeros_like(part_max)
    args = (q, summaries, req_to_token, req_pool_indices)
    out = (scores, part_max, part_sum)
    score_segments_triton(*args, shared, max_pages, sm_scale, out, 0, chunk_pages=shared_chunk)
    score_segments_triton(*args, own, max_pages, sm_scale, out, n_shared, tile_rows=OWN_TILE_ROWS,
                          chunk_pages=own_chunk)
    return scores, part_max, part_sum


def locks_scores_triton(q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale,
                        config: LocksConfig, state: SelectionState, candidates: torch.Tensor = None):
    """The PageScores the selection (selected_indices_triton) reads.

    Without the prefilter: score_pages_full's scores [B, Hq, max_pages] and
    partials, candidates None; where the Gluon kernels score MASS_MIN_GROUP
    or more query heads per KV head, mass is state.mass, to which they add
    each query head's mass (else None).
    Prefiltered (mass None): the candidates' full scores
    [B, Hq, M] in candidate order, the partials of the estimate and candidate
    launches side by side, and the candidate list (candidates, a
    candidate_buffer of >= B * H_kv rows; allocated when None). state: the
    candidate selection's. Every launch takes its kernel's defaults (the
    candidates are scored by Triton).
    """
    args = (q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale)
    if not prefiltered(config, max_pages):
        kernel = full_score_kernel(q, summaries, {})
        mass = None
        if kernel == "gluon" and q.shape[1] >= MASS_MIN_GROUP * summaries.num_kv_heads:
            mass = state.mass
        options = {"kernel": kernel} if mass is None else {"kernel": kernel, "mass": mass}
        return PageScores(*score_pages_full(*args, **options), None, mass)
    bsz, hq, _ = q.shape
    hkv = summaries.num_kv_heads
    rows, m = bsz * hkv, config.candidate_pages
    if candidates is None:
        candidates = candidate_buffer(rows, config, q.device)
    n_estimate = score_chunks(rows, max_pages, q.device, estimate_block_pages(config.prefilter_rank))[1]
    n_full = score_chunks(rows, m, q.device, BLOCK_PAGES)[1]
    estimates = torch.empty(bsz, hq, max_pages, dtype=torch.float32, device=q.device)
    part_max = torch.empty(bsz, hq, n_estimate + n_full, dtype=torch.float32, device=q.device)
    part_sum = torch.empty_like(part_max)
    score_pages_triton(*args, terms="estimate", estimate_rank=config.prefilter_rank,
                       out=(estimates, part_max, part_sum, 0))
    candidate_pages_triton(estimates, part_max, part_sum, n_estimate, req_to_token, req_pool_indices, seq_lens,
                           candidates, hkv, config.sink_pages, config.local_pages, config.gqa_aggregation, state)
    scores = torch.empty(bsz, hq, m, dtype=torch.float32, device=q.device)
    score_pages_triton(*args, terms="candidates", candidates=candidates, estimates=estimates,
                       out=(scores, part_max, part_sum, n_estimate))
    return PageScores(scores, part_max, part_sum, candidates)


def locks_aggregate_torch(q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale,
                          config: LocksConfig) -> torch.Tensor:
    """Reference of what the decode selection ranks: aggregated scores [B, H_kv, max_pages] (forced pages
    +inf), with the prefilter -inf for pages that are not candidates (chosen by float top-k); scores in
    the dtype of q."""
    args = (q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale)
    full = score_pages_torch(*args)
    estimates = None
    if prefiltered(config, max_pages):
        estimates = score_pages_torch(*args, terms="estimate", estimate_rank=config.prefilter_rank)
    return prefiltered_aggregate_torch(full, estimates, seq_lens, summaries.num_kv_heads, config)


def prefiltered_aggregate_torch(full, estimates, seq_lens, num_kv_heads: int, config: LocksConfig) -> torch.Tensor:
    """The selection's ranking from per-head scores [B, Hq, P]: full ones, and (prefiltered; None: every
    page in full) each page's estimate. Aggregated [B, H_kv, P], pages that are not candidates -inf."""
    forced = (config.sink_pages, config.local_pages, config.gqa_aggregation)
    if estimates is None:
        return aggregate_scores_torch(full, seq_lens, num_kv_heads, *forced)
    bsz, hq, max_pages = full.shape
    keep = torch.zeros(bsz * num_kv_heads, max_pages, dtype=torch.bool, device=full.device)
    candidates = select_pages(aggregate_scores_torch(estimates, seq_lens, num_kv_heads, *forced), config.candidate_pages)
    keep = keep.scatter_(1, candidates, True).view(bsz, num_kv_heads, max_pages)
    per_head = keep[:, :, None].expand(bsz, num_kv_heads, hq // num_kv_heads, max_pages).reshape(bsz, hq, max_pages)
    agg = aggregate_scores_torch(torch.where(per_head, full, estimates), seq_lens, num_kv_heads, *forced)
    return torch.where(keep, agg, torch.full_like(agg, float("-inf")))


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
    """Aggregated scores [B, H_kv, max_pages] of every sealed page scored in full (the prefilter is the
    decode step's shortcut, LocksDecode): +inf for forced pages, -inf past the sealed ones.

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
        return aggregate_scores_triton(*score_pages_full(*args), seq_lens, hkv, *forced)
    return aggregate_scores_torch(score_pages_torch(*args), seq_lens, hkv, *forced)
