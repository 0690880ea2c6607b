"""aggregate_scores: one score per (request, KV head, page) from the G query heads' scores.

Selection is per KV head, so the G query heads sharing it must agree on one
ranking. Aggregations (natural-log domain):

    mass       log sum_g exp(s_g - LSE_g)   the group's summed normalised mass
                                            (what the oracle maximises)
    max        max_g (s_g - LSE_g)          the most interested head decides
    logsumexp  log sum_g exp(s_g)           unnormalised: large-logit heads dominate

LSE_g (the log of query head g's total estimated mass) comes from the scoring
kernel's per-block partials. Forced pages get +inf (sink pages, the last
local_pages sealed pages) and pages past the sealed ones -inf, so a plain
top-k picks forced pages first and never padding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

AGGREGATIONS = {"mass": 0, "max": 1, "logsumexp": 2}
BLOCK_AGG = 1024


@triton.jit
def _aggregate_kernel(
    scores_ptr, part_max_ptr, part_sum_ptr, seq_lens_ptr, out_ptr,
    max_pages, n_blocks, sink_pages, local_pages,
    HKV: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr, PAGE: tl.constexpr,
    SCORE_BLOCK: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    b = row // HKV
    h = row % HKV
    n_sealed = tl.load(seq_lens_ptr + b) // PAGE
    g = tl.arange(0, BLOCK_G)
    gmask = g < G
    qrows = (b * HKV * G + h * G + g).to(tl.int64)

    if MODE != 2:
        # log of each query head's total estimated mass, merged from block partials.
        n_used = (n_sealed + SCORE_BLOCK - 1) // SCORE_BLOCK
        run_m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
        run_s = tl.zeros((BLOCK_G,), tl.float32)
        for start in range(0, n_used, BLOCK_N):
            j = start + tl.arange(0, BLOCK_N)
            msk = gmask[:, None] & (j[None, :] < n_used)
            off = qrows[:, None] * n_blocks + j[None, :]
            pm = tl.load(part_max_ptr + off, mask=msk, other=float("-inf"))
            ps = tl.load(part_sum_ptr + off, mask=msk, other=0.0)
            new_m = tl.maximum(run_m, tl.max(pm, 1))
            safe_m = tl.where(new_m == float("-inf"), 0.0, new_m)
            run_s = run_s * tl.exp(run_m - safe_m) + tl.sum(ps * tl.exp(pm - safe_m[:, None]), 1)
            run_m = new_m
        lse = tl.where(run_s > 0, run_m + tl.log(run_s), 0.0)

    p = chunk * BLOCK_A + tl.arange(0, BLOCK_A)
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


def aggregate_scores_triton(scores, part_max, part_sum, seq_lens, num_kv_heads, sink_pages, local_pages, mode, score_block):
    bsz, hq, max_pages = scores.shape
    group = hq // num_kv_heads
    out = torch.empty(bsz, num_kv_heads, max_pages, dtype=torch.float32, device=scores.device)
    grid = (bsz * num_kv_heads, triton.cdiv(max_pages, BLOCK_AGG))
    _aggregate_kernel[grid](
        scores, part_max, part_sum, seq_lens, out,
        max_pages, part_max.shape[-1], sink_pages, local_pages,
        HKV=num_kv_heads, G=group, BLOCK_G=triton.next_power_of_2(group), PAGE=16,
        SCORE_BLOCK=score_block, BLOCK_A=BLOCK_AGG, BLOCK_N=256, MODE=AGGREGATIONS[mode],
        num_warps=4,
    )
    return out


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
