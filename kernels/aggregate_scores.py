"""aggregate_scores: one score per (request, KV head, page) from the G query heads' scores.

Selection is per KV head, so the G query heads sharing it must agree on one
ranking. Aggregations (natural-log domain):

    mass       log sum_g exp(s_g - LSE_g)   the group's summed normalised mass
                                            (what the oracle maximises)
    max        max_g (s_g - LSE_g)          the most interested head decides
    logsumexp  log sum_g exp(s_g)           unnormalised: large-logit heads dominate

LSE_g (the log of query head g's total estimated mass) comes from the scoring
kernel's per-chunk partials. Forced pages get +inf (sink pages, the last
local_pages sealed pages) and pages past the sealed ones -inf, so a plain
top-k picks forced pages first and never padding.

The decode path's top-k (selected_indices_triton) aggregates with the same device
functions (row_lse, aggregate_block) and ranks pages by a one-byte key (page_key).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

AGGREGATIONS = {"mass": 0, "max": 1, "logsumexp": 2}
BLOCK_AGG = 1024  # pages per program
HIST_BINS = tl.constexpr(256)
# Selection keys: one byte, a page's share of its group's estimated mass over
# [-KEY_RANGE, 0] nats in steps of 1/KEY_SCALE nats (6 % of mass). Pages within
# one step of the k-th are interchangeable (the estimate errs by more; recall
# against float top-k: docs/accuracy.md).
# Shares below e^-16 (~1e-7) share key 0.
KEY_RANGE = tl.constexpr(16.0)
KEY_SCALE = tl.constexpr(16.0)
FORCED_KEY = tl.constexpr(255)


@triton.jit
def page_key(agg, offset):
    """Selection key in [0, 255]: larger for larger agg; +inf (forced) -> 255, shares below e^-16 -> 0."""
    v = (agg - offset + KEY_RANGE) * KEY_SCALE
    key = tl.minimum(tl.maximum(v, 0.0), FORCED_KEY - 1.0).to(tl.int32)
    return tl.where(agg == float("inf"), FORCED_KEY, key)


def partials_block(n_chunks: int, group: int) -> int:
    """Chunk partials row_lse loads at once: all of them where [G, n] stays within 4096 values (the
    loop's iterations are dependent round trips to memory)."""
    return max(16, min(triton.next_power_of_2(n_chunks), 4096 // triton.next_power_of_2(group)))


@triton.jit
def merge_partials(part_max_ptr, part_sum_ptr, qrows, gmask, n_chunks, stride, BLOCK_G: tl.constexpr,
                   BLOCK_N: tl.constexpr, CACHE: tl.constexpr):
    """(max, sum) per query head [BLOCK_G] of the first n_chunks (max, sum) partials, stride apart per query
    head (log-sum-exp partials: the head's mass is sum * e^max). CACHE: the loads' cache modifier."""
    run_m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    run_s = tl.zeros((BLOCK_G,), tl.float32)
    for start in range(0, n_chunks, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        msk = gmask[:, None] & (j[None, :] < n_chunks)
        off = qrows[:, None] * stride + j[None, :]
        pm = tl.load(part_max_ptr + off, mask=msk, other=float("-inf"), cache_modifier=CACHE)
        ps = tl.load(part_sum_ptr + off, mask=msk, other=0.0, cache_modifier=CACHE)
        new_m = tl.maximum(run_m, tl.max(pm, 1))
        safe_m = tl.where(new_m == float("-inf"), 0.0, new_m)
        run_s = run_s * tl.exp(run_m - safe_m) + tl.sum(ps * tl.exp(pm - safe_m[:, None]), 1)
        run_m = new_m
    return run_m, run_s


@triton.jit
def row_lse(part_max_ptr, part_sum_ptr, qrows, gmask, n_chunks, stride, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
            CACHE: tl.constexpr):
    """Log of each query head's total estimated mass [BLOCK_G], merged from the first n_chunks of the scoring
    kernel's chunk partials (stride apart per query head); 0 for a head without pages."""
    run_m, run_s = merge_partials(part_max_ptr, part_sum_ptr, qrows, gmask, n_chunks, stride, BLOCK_G, BLOCK_N, CACHE)
    return tl.where(run_s > 0, run_m + tl.log(run_s), 0.0)


@triton.jit
def aggregate_block(scores_ptr, qrows, gmask, width, p, n_items, page, n_sealed, lse, sink_pages, local_pages,
                    MODE: tl.constexpr):
    """Aggregated scores of items p (scores width apart per query head) of one (request, KV head), their
    logical pages page of n_sealed: +inf forced (sink and local pages), -inf past the row's n_items."""
    valid = p < n_items
    s = tl.load(scores_ptr + qrows[:, None] * width + p[None, :],
                mask=gmask[:, None] & valid[None, :], other=float("-inf"))
    if MODE == 0:
        x = s - lse[:, None]
        m = tl.max(x, 0)
        safe = tl.where(m == float("-inf"), 0.0, m)
        agg = safe + tl.log(tl.sum(tl.exp(x - safe[None, :]), 0))
    elif MODE == 1:
        agg = tl.max(s - lse[:, None], 0)
    else:
        m = tl.max(s, 0)
        safe = tl.where(m == float("-inf"), 0.0, m)
        agg = safe + tl.log(tl.sum(tl.exp(s - safe[None, :]), 0))
    forced = (page < sink_pages) | (page >= n_sealed - local_pages)
    agg = tl.where(forced, float("inf"), agg)
    return tl.where(valid, agg, float("-inf"))


@triton.jit
def key_offset(lse, gmask, MODE: tl.constexpr, LOG_G: tl.constexpr):
    """A bound on every page's agg, so that agg - offset <= 0 is the page's share of the group's mass."""
    if MODE == 0:
        offset = LOG_G
    elif MODE == 1:
        offset = 0.0
    else:
        lse_m = tl.max(tl.where(gmask, lse, float("-inf")), 0)
        offset = lse_m + tl.log(tl.sum(tl.where(gmask, tl.exp(lse - lse_m), 0.0), 0))
    return offset


@triton.jit
def _aggregate_kernel(
    scores_ptr, part_max_ptr, part_sum_ptr, seq_lens_ptr, out_ptr,
    max_pages, n_chunks, sink_pages, local_pages,
    HKV: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_A: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr,
):
    row = tl.program_id(0)
    b = row // HKV
    n_sealed = tl.load(seq_lens_ptr + b) // PAGE
    g = tl.arange(0, BLOCK_G)
    gmask = g < G
    qrows = (b * HKV * G + (row % HKV) * G + g).to(tl.int64)
    lse = row_lse(part_max_ptr, part_sum_ptr, qrows, gmask, n_chunks, n_chunks, BLOCK_G, BLOCK_N, "")
    p = tl.program_id(1) * BLOCK_A + tl.arange(0, BLOCK_A)
    agg = aggregate_block(scores_ptr, qrows, gmask, max_pages, p, n_sealed, p, n_sealed, lse, sink_pages, local_pages,
                          MODE)
    tl.store(out_ptr + row.to(tl.int64) * max_pages + p, agg, mask=p < max_pages)


def aggregate_scores_triton(scores, part_max, part_sum, seq_lens, num_kv_heads, sink_pages, local_pages, mode):
    """scores [B, Hq, P] and the scoring kernel's partials -> agg [B, H_kv, P]."""
    bsz, hq, max_pages = scores.shape
    group = hq // num_kv_heads
    rows = bsz * num_kv_heads
    out = torch.empty(bsz, num_kv_heads, max_pages, dtype=torch.float32, device=scores.device)
    _aggregate_kernel[(rows, triton.cdiv(max_pages, BLOCK_AGG))](
        scores, part_max, part_sum, seq_lens, out,
        max_pages, part_max.shape[-1], sink_pages, local_pages,
        HKV=num_kv_heads, G=group, BLOCK_G=triton.next_power_of_2(group), PAGE=16,
        BLOCK_A=BLOCK_AGG, BLOCK_N=partials_block(part_max.shape[-1], group), MODE=AGGREGATIONS[mode], num_warps=4,
    )
    return out


def key_offset_torch(part_max, part_sum, num_kv_heads, mode) -> torch.Tensor:
    """Reference of the kernel's per-row key offset [B * H_kv]."""
    bsz, hq, _ = part_max.shape
    group = hq // num_kv_heads
    if mode == "mass":
        return torch.full((bsz * num_kv_heads,), math.log(group), dtype=torch.float64)
    if mode == "max":
        return torch.zeros(bsz * num_kv_heads, dtype=torch.float64)
    lse = torch.logsumexp(part_max.double() + part_sum.double().log(), -1)
    lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))  # a head without pages: 0, as in the kernel
    return torch.logsumexp(lse.view(bsz * num_kv_heads, group), -1)


def page_key_torch(agg: torch.Tensor, offset: torch.Tensor, scale: float = KEY_SCALE.value,
                   span: float = KEY_RANGE.value) -> torch.Tensor:
    """Reference of page_key (agg [rows, P], offset [rows]), in float32 like the kernel, so keys match exactly.
    scale / span: keys of other resolutions (steps of 1/scale nat over span nats), for comparisons."""
    forced = round(span * scale) - 1
    v = (agg.float() - offset.float()[:, None] + span) * scale
    key = v.clamp(0, forced - 1).floor().long()
    return torch.where(agg == float("inf"), torch.full_like(key, forced), key)


def aggregate_scores_torch(scores, seq_lens, num_kv_heads, sink_pages, local_pages, mode):
    """Reference: scores [B, Hq, P] (-inf past sealed pages) -> [B, H_kv, P]."""
    bsz, hq, max_pages = scores.shape
    s = scores.view(bsz, num_kv_heads, hq // num_kv_heads, max_pages)
    if mode == "logsumexp":
        agg = torch.logsumexp(s, 2)
    else:
        lse = torch.logsumexp(s, -1, keepdim=True)
        x = s - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
        agg = torch.logsumexp(x, 2) if mode == "mass" else x.amax(2)
    p = torch.arange(max_pages, device=scores.device)
    n_sealed = (seq_lens.long() // 16)[:, None, None]
    forced = (p < sink_pages) | (p >= n_sealed - local_pages)
    agg = torch.where(forced, torch.full_like(agg, float("inf")), agg)
    return torch.where(p < n_sealed, agg, torch.full_like(agg, float("-inf")))
