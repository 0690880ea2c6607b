"""score_pages_gluon for G = 16 query heads per KV head (GLM-4-9B-1M), with the heads on the tensor cores' rows.

At G = 16 (GLM-4-9B-1M) score_pages_gluon spends most of its 147 instructions per (page, KV head) after the
basis mma (CPU SASS count): scaling the product, converting it to the per-key mma's B operand, the
exponentials, and summing each page's 16 keys across lanes (shuffles). Here the query heads are the rows
of the basis mma (16 rows: one int8 plane of q, see the kernel), the pair's 16 basis rows its columns. The
product [16 heads, 16 (page, rank)] is already the per-key mma's A operand (a C fragment reused as A, as
flash attention reuses P), the coefficients its block-diagonal B [16 (page, rank), 32 (page, key)], and
each page's keys lie along a quad of lanes and in registers (2 shuffle rounds). The centroid term takes
both int8 planes of q as A (32 rows: per 16-row tile, plane 0 of 8 heads then plane 1 of the same heads,
so that a thread holds both planes of a head and adds them in registers) against the step's centroids as B.

Why: at G = 16 it is faster than score_pages_gluon, and more so with the basis term against one query plane
and each page's log2 mass clamped once (the two together: either alone was not faster; docs/performance.md).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from .gluon_pipeline import (SMEM_STAGES, STEP_PAIRS, _idx2, _idx3, _int8_to_f16, _lg2, _next_step, _pdl_start,
                             _prologue, _row_span, _stage_buffers, _store_partials, _store_scores, _unpack_int4_x16)
from .score_pages_gluon import gluon_applies, launch_score_kernel


@gluon.jit
def _log2_mass(mass):
    """log2 of pages' summed exp2 terms, at most 127 (a term past 2^128 makes the sum inf), in a layout that holds
    each page once. The sums come out of the key reduction replicated over the quad of lanes that held the keys;
    taking the logarithm after the layout change saves those lanes' MUFU instructions (score_pages_gluon's G = 4
    form, 2 lanes per sum, measured no faster so). One clamp per page instead of each term's before its
    exponential saves an instruction per key."""
    return gl.minimum(_lg2(mass), 127.0)


@gluon.jit
def _score_pages_heads_kernel(
    q_ptr, stride_qb, stride_qh,
    mu_ptr, mu_scale_ptr, basis_ptr, coef_ptr, coef_scale_ptr,
    req_to_token_ptr, stride_rt, req_pool_ptr, seq_lens_ptr,
    scores_ptr, part_max_ptr, part_sum_ptr, part_stride, part_first, mass_ptr,
    max_pages, n_chunks, scale_log2,
    HKV: gl.constexpr, D: gl.constexpr, PAGE: gl.constexpr, PAIRS: gl.constexpr, STAGES: gl.constexpr,
    PDL: gl.constexpr, KEEP: gl.constexpr, MASS: gl.constexpr, num_warps: gl.constexpr,
):
    G: gl.constexpr = 16               # query heads per KV head
    MQ: gl.constexpr = 2 * G           # query plane rows
    R: gl.constexpr = 8
    HALF: gl.constexpr = D // 2
    BP: gl.constexpr = 2 * PAIRS       # pages per step
    MU_ROWS: gl.constexpr = 16 if BP < 16 else BP
    mma3: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1, 1],
                                                  instr_shape=[1, 16, 8])
    mma2: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, 8])
    a8: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma3, k_width=4)
    b8: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma3, k_width=4)
    a16: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma3, k_width=2)
    b16: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma3, k_width=2)
    a8m: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma2, k_width=4)
    b8m: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma2, k_width=4)
    blk: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[8, 4],
                                         warps_per_cta=[num_warps, 1], order=[1, 0])
    smem_v, smem_c, smem_m, smem_s, smem_u = _stage_buffers(STAGES, BP, MU_ROWS, D, PAGE)
    b, h, table, start, end, n_last, n_steps = _row_span(req_to_token_ptr, stride_rt, req_pool_ptr, seq_lens_ptr,
                                                         max_pages, n_chunks, BP, HKV, PAGE)
    rec_next = _prologue(smem_v, smem_c, smem_m, smem_s, smem_u, basis_ptr, coef_ptr, mu_ptr, coef_scale_ptr,
                         mu_scale_ptr, table, h, start, n_last, BP, HKV, D, PAGE, STAGES, num_warps)
    _pdl_start(PDL)  # after the prologue: see launch_score_kernel

    # The basis term's query rows: the G heads in order, q1 = round(q / s) (s = max|q| / 127 per head) alone
    # (score_pages.int8_query). Its rounding (2^-8 of max|q|) is below the int4 basis's own (recall on real text:
    # docs/accuracy.md) and leaves the basis mma half the rows of two
    # planes, and no planes to add. (This form of the prologue keeps 167 registers; IEEE divisions, rint or a
    # reciprocal took 191-255.)
    vq, vk = _idx2(G, HALF, blk)
    ptr = q_ptr + b * stride_qb + (h * G + vq) * stride_qh + vk
    lo = gl.load(ptr).to(gl.float32)
    hi = gl.load(ptr + HALF).to(gl.float32)
    amax = gl.maximum(gl.max(gl.abs(lo), 1), gl.max(gl.abs(hi), 1))
    s_head = gl.where(amax > 0, amax / 127.0, 1.0)                                     # [G]
    za = gl.zeros([PAIRS, G, HALF], gl.int8, a8)
    s = gl.expand_dims(s_head, 1)
    qa_lo = gl.expand_dims(gl.convert_layout(gl.floor(lo / s + 0.5).to(gl.int8), gl.SliceLayout(0, a8)), 0) + za
    qa_hi = gl.expand_dims(gl.convert_layout(gl.floor(hi / s + 0.5).to(gl.int8), gl.SliceLayout(0, a8)), 0) + za
    # 1/16: the basis's int4 values sit in the top nibble of their bytes (16 x)
    w_head = gl.convert_layout(s_head * (scale_log2 * 0.0625), gl.SliceLayout(0, gl.SliceLayout(2, mma3)))
    w_head = gl.expand_dims(gl.expand_dims(w_head, 0), 2)                             # [1, G, 1]

    # The centroid term (large: it keeps both planes), query plane rows m: head (m // 16) * 8 + m % 8, plane
    # (m // 8) % 2; q1 as above, q2 = round((q / s - q1) * 254).
    qm, qk = _idx2(MQ, HALF, blk)
    head = (qm // 16) * 8 + qm % 8
    second = ((qm // 8) % 2) == 1
    ptr = q_ptr + b * stride_qb + (h * G + head) * stride_qh + qk
    lo = gl.load(ptr).to(gl.float32)
    hi = gl.load(ptr + HALF).to(gl.float32)
    amax = gl.maximum(gl.max(gl.abs(lo), 1), gl.max(gl.abs(hi), 1))     # [MQ] per row = per head
    s = gl.expand_dims(gl.where(amax > 0, amax / 127.0, 1.0), 1)
    lo = lo / s
    hi = hi / s
    lo1 = gl.floor(lo + 0.5)
    hi1 = gl.floor(hi + 0.5)
    q_lo = gl.where(second, gl.floor((lo - lo1) * 254.0 + 0.5), lo1).to(gl.int8)
    q_hi = gl.where(second, gl.floor((hi - hi1) * 254.0 + 0.5), hi1).to(gl.int8)
    qm_lo = gl.convert_layout(q_lo, a8m)
    qm_hi = gl.convert_layout(q_hi, a8m)
    spm: gl.constexpr = gl.split(gl.permute(gl.reshape(gl.zeros([MQ, BP], gl.int32, mma2), [2, 2, 8, BP]),
                                            (0, 2, 3, 1)))[0].type.layout
    w_mu = gl.convert_layout(gl.reshape(s_head, [2, 8]) * (scale_log2 / 254.0), gl.SliceLayout(2, spm))
    w_mu = gl.expand_dims(w_mu, 2)                                                     # [2 tiles, 8 heads, 1]

    cvec: gl.constexpr = gl.BlockedLayout([1, 1, 16], [1, 16, 2], [num_warps, 1, 1], [2, 1, 0])
    # block-diagonal mask of the coefficient operand: (page of the pair, rank) x (page of the pair, key)
    _, bk, bn = _idx3(PAIRS, 16, 2 * PAGE, b16)
    b_live = (bk // R) == (bn // PAGE)
    ep: gl.constexpr = gl.BlockedLayout([1, 4], [16, 2], [num_warps, 1], [1, 0])        # [G, BP] scores, 4 pages per thread
    pos_head, pos_page = _idx2(G, BP, ep)
    pos_head, pos_page = gl.broadcast(pos_head, pos_page)
    out_row = (b * HKV * G + h * G + pos_head).to(gl.int64)
    run_m = gl.where(pos_head >= 0, float("-inf"), 0.0)
    run_s = gl.zeros_like(run_m)

    for it in range(n_steps):
        rec_next, st, p0 = _next_step(smem_v, smem_c, smem_m, smem_s, smem_u, basis_ptr, coef_ptr, mu_ptr,
                                      coef_scale_ptr, mu_scale_ptr, rec_next, it, table, h, start, n_last, BP, HKV,
                                      D, PAGE, STAGES, num_warps)

        # basis rows [(page, rank)] as the columns: B [PAIRS, 64 bytes (K), 16]
        vb = smem_v.index(st).reshape([PAIRS, 16, HALF]).permute([0, 2, 1]).load(b8)
        v_lo, v_hi = _unpack_int4_x16(vb)
        acc = mma_v2(qa_lo, v_lo, gl.zeros([PAIRS, G, 16], gl.int32, mma3))
        acc = mma_v2(qa_hi, v_hi, acc)
        cs = smem_s.index(st).reshape([PAIRS, 16]).load(gl.SliceLayout(1, mma3))
        proj = acc.to(gl.float32) * w_head * gl.expand_dims(cs, 1)
        proj = gl.convert_layout(proj.to(gl.float16), a16)
        # coefficients [PAIRS, 16 (page, rank), 16 keys] (16-byte rows), to fp16 in the operand layout, then
        # block-diagonal [PAIRS, 16, 32 (page, key)]: each key column twice, the other page's half zero
        c = smem_c.index(st).reshape([PAIRS, 16, PAGE]).load(cvec)
        cf = gl.convert_layout(_int8_to_f16(c), b16)
        cbd = gl.reshape(gl.permute(gl.join(cf, cf), (0, 1, 3, 2)), [PAIRS, 16, 2 * PAGE])
        cbd = gl.where(b_live, gl.convert_layout(cbd, b16), 0.0)
        local = mma_v2(proj, cbd, gl.zeros([PAIRS, G, 2 * PAGE], gl.float32, mma3))
        mass = gl.sum(gl.exp2(gl.reshape(local, [PAIRS, G, 2, PAGE])), 3)                  # [PAIRS, G, 2]
        lse = _log2_mass(gl.convert_layout(gl.reshape(gl.permute(mass, (1, 0, 2)), [G, BP]), ep))

        # q . mu: the query planes against the step's centroids [64 bytes (K), BP]
        mu = smem_m.index(st).slice(0, BP, 0)
        mu_lo = mu.slice(0, HALF, 1).permute([1, 0]).load(b8m)
        mu_hi = mu.slice(HALF, HALF, 1).permute([1, 0]).load(b8m)
        qmu = mma_v2(qm_hi, mu_hi, mma_v2(qm_lo, mu_lo, gl.zeros([MQ, BP], gl.int32, mma2)))
        m0, m1 = gl.split(gl.permute(gl.reshape(qmu, [2, 2, 8, BP]), (0, 2, 3, 1)))
        mu_scale = smem_u.index(st).slice(0, BP, 0).load(gl.SliceLayout(0, gl.SliceLayout(0, spm)))
        qmu = (m0 * 254 + m1).to(gl.float32) * w_mu * gl.expand_dims(gl.expand_dims(mu_scale, 0), 0)
        s2 = lse + gl.convert_layout(gl.reshape(qmu, [G, BP]), ep)

        p = p0 + pos_page
        run_m, run_s = _store_scores(scores_ptr, out_row, max_pages, p, p < end, s2, run_m, run_s, KEEP)
    async_copy.wait_group(0)
    _store_partials(part_max_ptr, part_sum_ptr, part_stride, part_first, mass_ptr, run_m, run_s, b * HKV * G + h * G,
                    G, G, 1, KEEP, MASS)


def score_pages_gluon_heads(q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale,
                            chunk_pages=None, out=None, pairs=STEP_PAIRS, stages=SMEM_STAGES, mass=None):
    """score_pages_gluon's launch (same arguments, outputs and chunking) for 16 query heads per KV head."""
    if not gluon_applies(q, summaries) or q.shape[1] != 16 * summaries.num_kv_heads:
        raise ValueError("score_pages_gluon_heads needs score_pages_gluon's conditions and 16 query heads per KV head")
    return launch_score_kernel(_score_pages_heads_kernel, "score_heads", q, summaries, req_to_token,
                               req_pool_indices, seq_lens, max_pages, sm_scale, chunk_pages, out, 2 * pairs, mass,
                               PAIRS=pairs, STAGES=stages, num_warps=1)
