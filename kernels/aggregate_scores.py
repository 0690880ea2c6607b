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

For the GPU top-k (selected_indices) each program can also keep the top
candidates of its BLOCK_AGG pages (a bitonic top-k in registers) as packed
(16-bit selection key, page) words: the row's top-k is among them, so the
top-k kernel reads n_chunks * k words instead of every page.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

AGGREGATIONS = {"mass": 0, "max": 1, "logsumexp": 2}
BLOCK_AGG = 1024  # pages per program; candidates pack a page's index in its chunk below the key
# Selection keys: fixed point over [-KEY_RANGE, 0] nats of a page's share of its
# group's estimated mass, in steps of 1/KEY_SCALE nats (0.1 % of mass).
KEY_RANGE = tl.constexpr(64.0)
KEY_SCALE = tl.constexpr(1024.0)


@triton.jit
def page_key(agg, offset):
    """16-bit selection key: larger for larger agg; +inf (forced) -> 65535, shares below e^-64 -> 0."""
    v = (agg - offset + KEY_RANGE) * KEY_SCALE
    key = tl.minimum(tl.maximum(v, 0.0), 65534.0).to(tl.int32)
    return tl.where(agg == float("inf"), 65535, key)


@triton.jit
def _aggregate_kernel(
    scores_ptr, part_max_ptr, part_sum_ptr, seq_lens_ptr, out_ptr, cand_ptr,
    max_pages, n_chunks, sink_pages, local_pages,
    HKV: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_A: tl.constexpr, SUB_A: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr, LOG_G: tl.constexpr,
    CAND: tl.constexpr, LOCAL_BITS: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    b = row // HKV
    h = row % HKV
    n_sealed = tl.load(seq_lens_ptr + b) // PAGE
    g = tl.arange(0, BLOCK_G)
    gmask = g < G
    qrows = (b * HKV * G + h * G + g).to(tl.int64)

    # log of each query head's total estimated mass, merged from the chunk partials.
    run_m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    run_s = tl.zeros((BLOCK_G,), tl.float32)
    for start in range(0, n_chunks, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        msk = gmask[:, None] & (j[None, :] < n_chunks)
        off = qrows[:, None] * n_chunks + j[None, :]
        pm = tl.load(part_max_ptr + off, mask=msk, other=float("-inf"))
        ps = tl.load(part_sum_ptr + off, mask=msk, other=0.0)
        new_m = tl.maximum(run_m, tl.max(pm, 1))
        safe_m = tl.where(new_m == float("-inf"), 0.0, new_m)
        run_s = run_s * tl.exp(run_m - safe_m) + tl.sum(ps * tl.exp(pm - safe_m[:, None]), 1)
        run_m = new_m
    lse = tl.where(run_s > 0, run_m + tl.log(run_s), 0.0)

    if CAND > 0:
        # A bound on every page's agg, so agg - offset <= 0 is the page's share of the group's mass.
        if MODE == 0:
            offset = LOG_G
        elif MODE == 1:
            offset = 0.0
        else:
            lse_m = tl.max(tl.where(gmask, lse, float("-inf")), 0)
            offset = lse_m + tl.log(tl.sum(tl.where(gmask, tl.exp(lse - lse_m), 0.0), 0))
        best = tl.full((CAND,), -1, tl.int32)

    # The chunk in sub-blocks of SUB_A pages (a [G, SUB_A] tile of scores fits the registers).
    for sub in tl.static_range(BLOCK_A // SUB_A):
        local = sub * SUB_A + tl.arange(0, SUB_A)
        p = chunk * BLOCK_A + local
        valid = p < n_sealed
        s = tl.load(scores_ptr + qrows[:, None] * max_pages + p[None, :],
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
        forced = (p < sink_pages) | (p >= n_sealed - local_pages)
        agg = tl.where(forced, float("inf"), agg)
        agg = tl.where(valid, agg, float("-inf"))
        tl.store(out_ptr + row.to(tl.int64) * max_pages + p, agg, mask=p < max_pages)
        if CAND > 0:
            # Larger key first; among equal keys the smaller page (larger complement) first.
            word = tl.where(valid, (page_key(agg, offset) << LOCAL_BITS) | (BLOCK_A - 1 - local), -1)
            if SUB_A == BLOCK_A:
                best = tl.topk(word, CAND)
            else:
                best = tl.topk(tl.reshape(tl.join(best, tl.topk(word, CAND)), (2 * CAND,)), CAND)
    if CAND > 0:
        tl.store(cand_ptr + (row * tl.num_programs(1) + chunk).to(tl.int64) * CAND + tl.arange(0, CAND), best)


def candidates_per_chunk(budget_pages: int) -> int:
    """Candidates each aggregation program keeps: the budget rounded up to a power of two."""
    return triton.next_power_of_2(max(budget_pages, 1))


MAX_CHUNKS = 16  # candidate chunks per row the top-k kernel merges, up to 4096-page chunks


def aggregate_block(budget_pages: int, max_pages: int) -> int:
    """Pages per aggregation program when it keeps candidates (selected_indices must agree).

    At most MAX_CHUNKS chunks (up to 4096 pages each): the single top-k program
    per row then merges few candidates, while many programs share the chunks.
    """
    pages = triton.next_power_of_2(max(max_pages, 1))
    block = min(pages, max(BLOCK_AGG, min(4 * BLOCK_AGG, pages // MAX_CHUNKS)))
    return max(candidates_per_chunk(budget_pages), block)


def aggregate_scores_triton(scores, part_max, part_sum, seq_lens, num_kv_heads, sink_pages, local_pages, mode,
                            budget_pages=None):
    """scores [B, Hq, P] and the scoring kernel's partials -> agg [B, H_kv, P].

    With budget_pages, also returns the top-k candidates cand [B * H_kv,
    n_chunks, kc] int32 (kc = candidates_per_chunk; -1 = none): per chunk of
    aggregate_block pages, (page_key << log2(block)) | (block - 1 - page in chunk),
    largest first.
    """
    bsz, hq, max_pages = scores.shape
    group = hq // num_kv_heads
    out = torch.empty(bsz, num_kv_heads, max_pages, dtype=torch.float32, device=scores.device)
    block = BLOCK_AGG if budget_pages is None else aggregate_block(budget_pages, max_pages)
    grid = (bsz * num_kv_heads, triton.cdiv(max_pages, block))
    kc = 0 if budget_pages is None else candidates_per_chunk(budget_pages)
    cand = torch.empty(grid[0], grid[1], max(kc, 1), dtype=torch.int32, device=scores.device)
    _aggregate_kernel[grid](
        scores, part_max, part_sum, seq_lens, out, cand,
        max_pages, part_max.shape[-1], sink_pages, local_pages,
        HKV=num_kv_heads, G=group, BLOCK_G=triton.next_power_of_2(group), PAGE=16,
        BLOCK_A=block, SUB_A=min(block, max(BLOCK_AGG, kc)), BLOCK_N=64, MODE=AGGREGATIONS[mode], LOG_G=math.log(group),
        CAND=kc, LOCAL_BITS=block.bit_length() - 1,
        num_warps=4,
    )
    return out if budget_pages is None else (out, cand)


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


def page_key_torch(agg: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Reference of page_key (agg [rows, P], offset [rows]), in float32 like the kernel, so keys match exactly."""
    v = (agg.float() - offset.float()[:, None] + KEY_RANGE.value) * KEY_SCALE.value
    key = v.clamp(0, 65534).floor().long()
    return torch.where(agg == float("inf"), torch.full_like(key, 65535), key)


def chunk_candidates_torch(agg, key_offset, budget_pages):
    """Reference of the candidates aggregate_scores_triton returns with budget_pages."""
    rows = agg.shape[0] * agg.shape[1]
    flat = agg.reshape(rows, -1)
    block, kc = aggregate_block(budget_pages, agg.shape[-1]), candidates_per_chunk(budget_pages)
    n_chunks = -(-flat.shape[1] // block)
    flat = torch.nn.functional.pad(flat, (0, n_chunks * block - flat.shape[1]), value=float("-inf"))
    local = block - 1 - torch.arange(block)
    words = (page_key_torch(flat, key_offset).view(rows, n_chunks, block) << (block.bit_length() - 1)) | local
    words = torch.where(flat.view(rows, n_chunks, block) == float("-inf"), torch.full_like(words, -1), words)
    return words.topk(kc, -1).values


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
