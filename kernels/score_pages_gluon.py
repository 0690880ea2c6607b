"""score_pages's "full" launch in Gluon: int8-int4-int8 summaries of rank 8, the sealed pages on the
tensor cores' rows.

The Triton kernel (score_pages.py) multiplies the query rows (G heads x two
int8 planes, padded to 16) by each page's basis; at G = 4 half of every tile
is padding, and its summary loads wait in registers with nothing to overlap
them. Here, per pair of pages and KV head, on one warp:

  1. P = [V_a; V_b] q: int8 mma with the two pages' 16 basis rows (page, rank)
     as A, unpacked from int4 in registers, and the query columns (head, plane)
     as B (N = 2 G >= 8): no padded rows at G >= 4.
  2. The planes add up in integers (254 q1 + q2: the columns of one head are
     one thread's registers), scaled per row (coefficient scale) and column
     (head) to fp16: the B operand (K = the pair's 16 (page, rank)) of the
     per-key mma, block-diagonal over the two pages, whose A is the 16 keys'
     coefficients of both pages.
  3. Each page's log-sum-exp over its keys; + q . mu from an int8 mma with the
     step's centroids as the rows of A.

Summary bytes reach shared memory by cp.async, 16 bytes per copy, one step
ahead (two stages), the page ids of the step after that loaded meanwhile;
the operands are read from shared memory. One warp per program. Each warp
instruction copies runs of whole pages' bytes (_page_copy_layout: what DRAM
serves fastest), each coefficient row is copied once and the centroid rows
are swizzled (bank-conflict and instruction costs found by Nsight Compute).

Why: at G = 4 the pages on the rows leave no padded rows and half the
Triton kernel's instructions per (page, KV head); it is the faster kernel
where it applies (docs/performance.md). Scores equal the Triton kernel's to
its error against the float64 reference (GQA groups 1-16).
"""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from ._triton import L2_KEEP, dependent_launch, interpreted
from .gluon_pipeline import (SMEM_STAGES, STEP_PAIRS, _idx2, _idx3, _int8_to_f16, _lg2, _next_step, _pdl_start,
                             _prologue, _row_span, _stage_buffers, _store_partials, _store_scores, _unpack_int4_x16)
from .score_pages import LOG2E, score_chunks, score_outputs


@gluon.jit
def _score_pages_gluon_kernel(
    q_ptr, stride_qb, stride_qh,
    mu_ptr, mu_scale_ptr, basis_ptr, coef_ptr, coef_scale_ptr,
    req_to_token_ptr, stride_rt, req_pool_ptr, seq_lens_ptr,
    scores_ptr, part_max_ptr, part_sum_ptr, part_stride, part_first, mass_ptr,
    max_pages, n_chunks, scale_log2,
    HKV: gl.constexpr, G: gl.constexpr, D: gl.constexpr, PAGE: gl.constexpr, NC: gl.constexpr,
    PAIRS: gl.constexpr, STAGES: gl.constexpr, PDL: gl.constexpr, KEEP: gl.constexpr, MASS: gl.constexpr,
    num_warps: gl.constexpr,
):
    R: gl.constexpr = 8
    HALF: gl.constexpr = D // 2
    GH: gl.constexpr = NC // 2          # query heads, padded
    BP: gl.constexpr = 2 * PAIRS        # pages per step
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
    blk: gl.constexpr = gl.BlockedLayout(size_per_thread=[4, 1], threads_per_warp=[4, 8],
                                         warps_per_cta=[1, num_warps], order=[0, 1])
    smem_v, smem_c, smem_m, smem_s, smem_u = _stage_buffers(STAGES, BP, MU_ROWS, D, PAGE)
    b, h, table, start, end, n_last, n_steps = _row_span(req_to_token_ptr, stride_rt, req_pool_ptr, seq_lens_ptr,
                                                         max_pages, n_chunks, BP, HKV, PAGE)
    if BP < MU_ROWS:  # centroid rows past the step's pages stay zero
        zl2: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
        for z in gl.static_range(STAGES):
            smem_m.index(z).store(gl.zeros([MU_ROWS, D], gl.int8, zl2))
            smem_u.index(z).store(gl.zeros([MU_ROWS], gl.float32, gl.BlockedLayout([1], [32], [num_warps], [0])))
    rec_next = _prologue(smem_v, smem_c, smem_m, smem_s, smem_u, basis_ptr, coef_ptr, mu_ptr, coef_scale_ptr,
                         mu_scale_ptr, table, h, start, n_last, BP, HKV, D, PAGE, STAGES, num_warps)
    _pdl_start(PDL)  # after the prologue: see launch_score_kernel

    # Query columns n = 2 head + plane: q1 = round(q / s) (plane 0), q2 = round((q / s - q1) * 254).
    qk, qn = _idx2(HALF, NC, blk)
    head = qn // 2
    ptr = q_ptr + b * stride_qb + (h * G + gl.minimum(head, G - 1)) * stride_qh + qk
    lo = gl.load(ptr, mask=head < G, other=0.0).to(gl.float32)
    hi = gl.load(ptr + HALF, mask=head < G, other=0.0).to(gl.float32)
    amax = gl.maximum(gl.max(gl.abs(lo), 0), gl.max(gl.abs(hi), 0))
    s1 = gl.where(amax > 0, amax / 127.0, 1.0)
    n1 = gl.arange(0, NC, layout=gl.SliceLayout(0, blk))
    w1 = gl.where(n1 % 2 == 0, s1, s1 / 254.0) * scale_log2         # [NC] column weight (centroid term)
    # the layout of the basis product's two planes once split (columns 2 head + plane)
    spl: gl.constexpr = gl.split(gl.reshape(gl.zeros([PAIRS, 16, NC], gl.int32, mma3), [PAIRS, 16, GH, 2]))[0].type.layout
    wh = gl.convert_layout(gl.max(gl.reshape(s1, [GH, 2]), 1), gl.SliceLayout(0, gl.SliceLayout(0, spl)))
    # head weight [1, 1, GH]; 1/16: the basis's int4 values sit in the top nibble of their bytes (16 x)
    w3 = gl.expand_dims(gl.expand_dims(wh * (scale_log2 / (254.0 * 16.0)), 0), 0)
    s = gl.expand_dims(s1, 0)
    lo = lo / s
    hi = hi / s
    lo1 = gl.floor(lo + 0.5)
    hi1 = gl.floor(hi + 0.5)
    first = (qn % 2) == 0
    q_lo = gl.where(first, lo1, gl.floor((lo - lo1) * 254.0 + 0.5)).to(gl.int8)
    q_hi = gl.where(first, hi1, gl.floor((hi - hi1) * 254.0 + 0.5)).to(gl.int8)
    zb = gl.zeros([PAIRS, HALF, NC], gl.int8, b8)
    qb_lo = gl.expand_dims(gl.convert_layout(q_lo, gl.SliceLayout(0, b8)), 0) + zb
    qb_hi = gl.expand_dims(gl.convert_layout(q_hi, gl.SliceLayout(0, b8)), 0) + zb
    qm_lo = gl.convert_layout(q_lo, b8m)
    qm_hi = gl.convert_layout(q_hi, b8m)
    wm = gl.expand_dims(gl.convert_layout(w1, gl.SliceLayout(0, mma2)), 0)

    bj, bk, bn = _idx3(PAIRS, 16, NC, b16)
    b_live = (bk // R) == (bn // GH)
    # Score positions [BP, GH], one per thread (BP * GH = 32: no replicated epilogue).
    ep: gl.constexpr = gl.BlockedLayout([1, 1], [32 // GH, GH], [num_warps, 1], [1, 0])  # BP * GH >= 32 * num_warps
    pos_page, pos_head = _idx2(BP, GH, ep)
    pos_page, pos_head = gl.broadcast(pos_page, pos_head)
    out_row = (b * HKV * G + h * G + pos_head).to(gl.int64)
    run_m = gl.where(pos_head >= 0, float("-inf"), 0.0)
    run_s = gl.zeros_like(run_m)

    for it in range(n_steps):
        rec_next, st, p0 = _next_step(smem_v, smem_c, smem_m, smem_s, smem_u, basis_ptr, coef_ptr, mu_ptr,
                                      coef_scale_ptr, mu_scale_ptr, rec_next, it, table, h, start, n_last, BP, HKV,
                                      D, PAGE, STAGES, num_warps)

        vb = smem_v.index(st).reshape([PAIRS, 16, HALF]).load(a8)
        cs = gl.expand_dims(smem_s.index(st).reshape([PAIRS, 16]).load(gl.SliceLayout(2, spl)), 2)
        c = smem_c.index(st).reshape([PAIRS, 16, PAGE]).permute([0, 2, 1]).load(a16)
        mu = smem_m.index(st)
        mu_lo = mu.slice(0, HALF, 1).load(a8m)
        mu_hi = mu.slice(HALF, HALF, 1).load(a8m)
        mu_scale = gl.expand_dims(smem_u.index(st).load(gl.SliceLayout(1, mma2)), 1)

        v_lo, v_hi = _unpack_int4_x16(vb)
        acc = mma_v2(v_lo, qb_lo, gl.zeros([PAIRS, 16, NC], gl.int32, mma3))
        acc = mma_v2(v_hi, qb_hi, acc)
        # the planes add up in integers (columns 2 head + plane: one thread's registers): 254 q1 + q2
        a0, a1 = gl.split(gl.reshape(acc, [PAIRS, 16, GH, 2]))
        proj = ((a0 * 254 + a1).to(gl.float32) * cs * w3).to(gl.float16)
        # B [PAIRS, 16 (page of the pair, rank), 2 GH (page of the pair, head)]: block-diagonal
        pbd = gl.reshape(gl.permute(gl.join(proj, proj), (0, 1, 3, 2)), [PAIRS, 16, NC])
        pbd = gl.where(b_live, gl.convert_layout(pbd, b16), 0.0)
        local = mma_v2(_int8_to_f16(c), pbd, gl.zeros([PAIRS, PAGE, NC], gl.float32, mma3))
        mass = gl.sum(gl.exp2(gl.minimum(gl.reshape(local, [PAIRS, PAGE, 2, GH]), 120.0)), 1)   # [PAIRS, 2, GH]
        lse = gl.convert_layout(gl.reshape(_lg2(mass), [BP, GH]), ep)

        qmu = mma_v2(mu_hi, qm_hi, mma_v2(mu_lo, qm_lo, gl.zeros([MU_ROWS, NC], gl.int32, mma2)))
        qmu = gl.sum(gl.reshape(qmu.to(gl.float32) * wm * mu_scale, [MU_ROWS, GH, 2]), 2)
        if MU_ROWS != BP:
            qmu = gl.sum(gl.reshape(qmu, [MU_ROWS // BP, BP, GH]), 0)
        s2 = lse + gl.convert_layout(qmu, ep)

        p = p0 + pos_page
        run_m, run_s = _store_scores(scores_ptr, out_row, max_pages, p, (p < end) & (pos_head < G), s2, run_m, run_s,
                                     KEEP)
    async_copy.wait_group(0)
    _store_partials(part_max_ptr, part_sum_ptr, part_stride, part_first, mass_ptr, run_m, run_s, b * HKV * G + h * G,
                    G, GH, 0, KEEP, MASS)


def gluon_applies(q: torch.Tensor, summaries) -> bool:
    """Whether score_pages_gluon scores q against summaries (otherwise score_pages_triton). head_dim 128
    only: the kernel is written for any multiple of 64, but only 128 has been run (the Llama-3.1-8B and
    GLM-4-9B shapes). Its summary offsets are 32-bit: larger stores take the Triton kernel's 64-bit ones."""
    group = q.shape[1] // summaries.num_kv_heads
    return (summaries.quantized and summaries.rank == 8 and q.shape[2] == 128 and group <= 16
            and group & (group - 1) == 0 and summaries.basis.numel() < 2**31
            and q.device.type == "cuda" and not interpreted()
            and _sm80_or_later(q.device.index if q.device.index is not None else torch.cuda.current_device()))


@functools.lru_cache(maxsize=None)
def _sm80_or_later(device_index: int) -> bool:
    """cp.async and int8 mma.sync; cached: gluon_applies runs per layer on the host."""
    return torch.cuda.get_device_capability(device_index)[0] >= 8


def score_pages_gluon(q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale, chunk_pages=None,
                      out=None, pairs=STEP_PAIRS, stages=SMEM_STAGES, num_warps=1, mass=None):
    """score_pages_triton's "full" launch (same arguments, outputs and chunking) where gluon_applies.
    pairs: page pairs per warp and step; stages: steps in shared memory; num_warps: warps per program;
    mass: see launch_score_kernel."""
    if not gluon_applies(q, summaries):
        raise ValueError("score_pages_gluon needs a CUDA GPU (sm80+), int8-int4-int8 summaries of rank 8 (basis under "
                         "2**31 bytes), head_dim 128 and a power-of-two group of at most 16 query heads per KV head")
    if pairs not in (1, 2, 4, 8, 16) or num_warps not in (1, 2, 4):
        raise ValueError(f"pairs must be 1, 2, 4, 8 or 16 and num_warps 1, 2 or 4, got {pairs}, {num_warps}")
    group = q.shape[1] // summaries.num_kv_heads
    return launch_score_kernel(_score_pages_gluon_kernel, "score", q, summaries, req_to_token, req_pool_indices,
                               seq_lens, max_pages, sm_scale, chunk_pages, out, 2 * pairs * num_warps, mass,
                               G=group, NC=max(8, 2 * group), PAIRS=pairs * num_warps, STAGES=stages,
                               num_warps=num_warps)


def launch_score_kernel(kernel, chain, q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale,
                        chunk_pages, out, block_pages, mass=None, **consts):
    """Launch a Gluon score kernel over (request x KV head, chunk) programs of block_pages-page steps: its outputs
    (scores, part_max, part_sum) allocated or the caller's (out), consts its own compile-time arguments.

    mass: None, or float64 [>= B * Hq, slots] zeros (or masses of earlier launches) to which each program adds
    its chunk's mass per query head (sum_pages e^score, in float64: ln of the slots' sum is the head's
    log-sum-exp) at slot chunk % slots (the programs of a row end together: one address each would queue
    them), so that the selection after it reads each head's total instead of merging the chunks' partials
    (its mass argument: selected_indices_triton). It pays off from scoring.MASS_MIN_GROUP query heads per KV head
    (docs/performance.md).

    chain: the kernel's name in the decode chain (_triton.dependent_launch). Launched as a dependent, a program
    reads its row's page table and puts its first summaries in flight before it waits for the kernel before
    it, and reads q after: the table, lengths and summaries are written before the decode step, never by that
    kernel (LocksDecode.run's contract). At 16 query heads per KV head ("score_heads") it is not launched so by
    default: that kernel has room for 12 programs per SM, and its programs launched early pile up unevenly
    beside the running kernel's, which measured slower (docs/performance.md)."""
    bsz, hq, d = q.shape
    hkv = summaries.num_kv_heads
    chunk_pages, n_chunks = score_chunks(bsz * hkv, max_pages, q.device, block_pages, chunk_pages)
    scores, part_max, part_sum, first = score_outputs(bsz, hq, max_pages, n_chunks, q.device, out)
    if mass is not None and (mass.dtype != torch.float64 or mass.dim() != 2 or mass.shape[0] < bsz * hq
                             or not mass.is_contiguous()):
        raise ValueError(f"mass must be a contiguous float64 [>= {bsz * hq}, slots] tensor, got {mass.dtype} "
                         f"{tuple(mass.shape)}")
    if q.stride(2) != 1:
        q = q.contiguous()
    kernel[(bsz * hkv, n_chunks)](
        q, q.stride(0), q.stride(1),
        summaries.mu, summaries.mu_scale, summaries.basis, summaries.coef, summaries.coef_scale,
        req_to_token, req_to_token.stride(0), req_pool_indices, seq_lens,
        scores, part_max, part_sum, part_max.shape[-1], first, part_sum if mass is None else mass,
        max_pages, n_chunks, sm_scale * LOG2E,
        HKV=hkv, D=d, PAGE=16, **dependent_launch(q.device, chain), KEEP=L2_KEEP,
        MASS=0 if mass is None else mass.shape[1], **consts,
    )
    return scores, part_max, part_sum
