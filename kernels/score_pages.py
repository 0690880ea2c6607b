"""score_pages: estimated log attention mass of every sealed page, from summaries only.

    s[b, hq, p] = logsumexp_i [ (q . mu_p + (V_p q) . c_p,i) * sm_scale ]

The kernel never reads K or V. One program scores BLOCK_P pages of one
(request, KV head) for all G query heads of the group: q (G x d, padded to 16
rows) times the page centroids and the r basis rows of BLOCK_P pages are
tensor-core dots with int8/int4 operands converted exactly to bf16. Each
program also writes, per query head, the max and the sum of exp over its
block, so that aggregate_scores can normalise per head without another pass
over all scores.

Bytes per (page, KV head): the summary (804 for d=128, r=8, int8-int4-int8)
+ 4 for the page id + 4*G for the scores written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._triton import dot_in_bf16

LOG2E = 1.4426950408889634


@triton.jit
def _dot(a, b, BF16: tl.constexpr):
    if BF16:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    return tl.dot(a.to(tl.float32), b.to(tl.float32))


@triton.jit
def _unpack_lo(x):
    return (((x & 15) ^ 8) - 8).to(tl.float32)


@triton.jit
def _unpack_hi(x):
    return ((((x >> 4) & 15) ^ 8) - 8).to(tl.float32)


@triton.jit
def _score_pages_kernel(
    q_ptr, stride_qb, stride_qh,
    mu_ptr, mu_scale_ptr, basis_ptr, coef_ptr, coef_scale_ptr,
    req_to_token_ptr, stride_rt, req_pool_ptr, seq_lens_ptr,
    scores_ptr, part_max_ptr, part_sum_ptr,
    max_pages, n_blocks, scale_log2,
    HKV: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr,
    R: tl.constexpr, PAGE: tl.constexpr, BLOCK_P: tl.constexpr,
    QUANT: tl.constexpr, DOT_BF16: tl.constexpr,
):
    row = tl.program_id(0)
    blk = tl.program_id(1)
    b = row // HKV
    h = row % HKV
    HALF: tl.constexpr = D // 2
    n_sealed = tl.load(seq_lens_ptr + b) // PAGE
    req = tl.load(req_pool_ptr + b).to(tl.int64)

    g = tl.arange(0, BLOCK_G)
    gmask = g < G
    qh = h * G + g
    p = blk * BLOCK_P + tl.arange(0, BLOCK_P)
    valid = p < n_sealed
    out_rows = (b * HKV * G + qh).to(tl.int64)
    part_off = out_rows * n_blocks + blk

    if blk * BLOCK_P >= n_sealed:
        s_off = out_rows[:, None] * max_pages + p[None, :]
        tl.store(scores_ptr + s_off, tl.full((BLOCK_G, BLOCK_P), float("-inf"), tl.float32),
                 mask=gmask[:, None] & (p[None, :] < max_pages))
        tl.store(part_max_ptr + part_off, tl.full((BLOCK_G,), float("-inf"), tl.float32), mask=gmask)
        tl.store(part_sum_ptr + part_off, tl.zeros((BLOCK_G,), tl.float32), mask=gmask)
        return

    slot = tl.load(req_to_token_ptr + req * stride_rt + p * PAGE, mask=valid, other=0)
    rec = (slot // PAGE).to(tl.int64) * HKV + h  # summary record of (page, KV head)

    k = tl.arange(0, HALF)
    q_base = q_ptr + b * stride_qb + qh[:, None] * stride_qh + k[None, :]
    q_lo = tl.load(q_base, mask=gmask[:, None], other=0.0)
    q_hi = tl.load(q_base + HALF, mask=gmask[:, None], other=0.0)

    # q . mu as two half-width dots (the int4 basis is stored that way, mu follows suit).
    mu_base = mu_ptr + rec[None, :] * D + k[:, None]
    mu_lo = tl.load(mu_base, mask=valid[None, :], other=0).to(tl.float32)
    mu_hi = tl.load(mu_base + HALF, mask=valid[None, :], other=0).to(tl.float32)
    qmu = _dot(q_lo, mu_lo, DOT_BF16) + _dot(q_hi, mu_hi, DOT_BF16)
    qmu = qmu * tl.load(mu_scale_ptr + rec, mask=valid, other=0.0)[None, :]

    i = tl.arange(0, PAGE)
    local = tl.zeros((BLOCK_G, BLOCK_P, PAGE), tl.float32)
    for r in tl.static_range(R):
        if QUANT:
            vb = tl.load(basis_ptr + (rec[None, :] * R + r) * HALF + k[:, None],
                         mask=valid[None, :], other=0).to(tl.int32)
            proj = _dot(q_lo, _unpack_lo(vb), DOT_BF16) + _dot(q_hi, _unpack_hi(vb), DOT_BF16)
        else:
            v_base = basis_ptr + (rec[None, :] * R + r) * D + k[:, None]
            v_lo = tl.load(v_base, mask=valid[None, :], other=0.0).to(tl.float32)
            v_hi = tl.load(v_base + HALF, mask=valid[None, :], other=0.0).to(tl.float32)
            proj = _dot(q_lo, v_lo, DOT_BF16) + _dot(q_hi, v_hi, DOT_BF16)
        cs = tl.load(coef_scale_ptr + rec * R + r, mask=valid, other=0.0)
        c = tl.load(coef_ptr + (rec[:, None] * R + r) * PAGE + i[None, :],
                    mask=valid[:, None], other=0).to(tl.float32)
        local += (proj * cs[None, :])[:, :, None] * c[None, :, :]

    logits = (qmu[:, :, None] + local) * scale_log2  # log2 domain: exp2 is one instruction
    m = tl.max(logits, 2)
    s2 = m + tl.log2(tl.sum(tl.exp2(logits - m[:, :, None]), 2))
    s2 = tl.where(valid[None, :], s2, float("-inf"))
    s_off = out_rows[:, None] * max_pages + p[None, :]
    tl.store(scores_ptr + s_off, s2 * 0.6931471805599453, mask=gmask[:, None] & (p[None, :] < max_pages))

    bm = tl.max(s2, 1)
    bsum = tl.sum(tl.exp2(s2 - bm[:, None]), 1)
    tl.store(part_max_ptr + part_off, bm * 0.6931471805599453, mask=gmask)
    tl.store(part_sum_ptr + part_off, bsum, mask=gmask)


# 32 pages x 16 padded query rows x 16 keys of fp32 logits fit 4 warps' registers.
BLOCK_PAGES = 32


def score_pages_triton(q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale,
                       block_pages=BLOCK_PAGES, num_warps=4):
    """Launch the scoring kernel.

    q [B, Hq, d]; summaries: PageSummaries of this layer; req_to_token [R, ctx]
    int32 slot table; req_pool_indices [B]; seq_lens [B] (tokens in the cache,
    the unsealed tail included); max_pages >= max(seq_lens) // 16.
    Returns scores [B, Hq, max_pages] (natural-log mass, -inf past each
    request's sealed pages) and the per-block (max, sum-exp) partials
    [B, Hq, n_blocks].
    """
    bsz, hq, d = q.shape
    hkv, rank = summaries.num_kv_heads, summaries.rank
    group = hq // hkv
    block_p = block_pages
    n_blocks = max(1, triton.cdiv(max_pages, block_p))
    scores = torch.empty(bsz, hq, max_pages, dtype=torch.float32, device=q.device)
    part_max = torch.empty(bsz, hq, n_blocks, dtype=torch.float32, device=q.device)
    part_sum = torch.empty_like(part_max)
    if q.stride(2) != 1:
        q = q.contiguous()
    grid = (bsz * hkv, n_blocks)
    _score_pages_kernel[grid](
        q, q.stride(0), q.stride(1),
        summaries.mu, summaries.mu_scale, summaries.basis, summaries.coef, summaries.coef_scale,
        req_to_token, req_to_token.stride(0), req_pool_indices, seq_lens,
        scores, part_max, part_sum,
        max_pages, n_blocks, sm_scale * LOG2E,
        HKV=hkv, G=group, BLOCK_G=max(16, triton.next_power_of_2(group)), D=d, R=rank,
        PAGE=16, BLOCK_P=block_p, QUANT=summaries.quantized, DOT_BF16=dot_in_bf16(q.device),
        num_warps=num_warps,
    )
    return scores, part_max, part_sum


def score_pages_torch(q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale):
    """Reference in the dtype of q (use float64 q for a float64 reference). Returns scores only."""
    bsz, hq, d = q.shape
    hkv = summaries.num_kv_heads
    group = hq // hkv
    p = torch.arange(max_pages, device=q.device)
    n_sealed = seq_lens.long() // 16
    valid = p[None, :] < n_sealed[:, None]  # [B, P]
    slots = req_to_token[req_pool_indices.long()][:, : max_pages * 16 : 16]
    slots = torch.nn.functional.pad(slots, (0, max_pages - slots.shape[1]))
    page_ids = torch.where(valid, slots.long() // 16, 0)
    mu, basis, coef = (t.to(q.dtype) for t in summaries.dequantize(page_ids))  # [B, P, H, ...]
    qg = q.view(bsz, hkv, group, d)
    qmu = torch.einsum("bhgd,bphd->bhgp", qg, mu)
    proj = torch.einsum("bhgd,bphrd->bhgpr", qg, basis)
    local = torch.einsum("bhgpr,bphir->bhgpi", proj, coef)
    s = torch.logsumexp((qmu[..., None] + local) * sm_scale, -1)
    s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
    return s.reshape(bsz, hq, max_pages)
