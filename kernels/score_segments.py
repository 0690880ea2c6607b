"""score_segments: score_pages' page scores, with pages that several requests share scored once for all of them.

A segment is a run of pages [start, end) of one request's page table (its
``table`` row of the batch) and the batch rows whose query heads score it (its
members). A program takes one segment, one KV head, one block of MB members and
one chunk of the segment's pages: the members' query heads are the rows of its
tensor-core tiles (MB x G of them, instead of score_pages' G), so a shared
page's summary is loaded, unpacked and multiplied once for MB requests. Each
member's scores land where score_pages writes them ([B, Hq, max_pages], at the
logical page), and each program writes per member query head the (max, sum of
exp) of its chunk, at partial column part_first + chunk: a launch over the
shared runs and one over the requests' own pages give the selection what one
score_pages launch gives it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._triton import interpreted
from .score_pages import (BLOCK_PAGES, CONVERSIONS, LN2, MAX_GROUP, _basis_term, _centroid_term, _page_lse,
                          _to_dot_dtype, chunk_pages_for)


@dataclass(frozen=True)
class Segments:
    """Segments of one launch, int32 on the device, one slot each [S] (a slot with count 0 scores nothing): the
    batch row whose page table it reads (``table``), its pages [``start``, ``end``), and its members
    ``members[first : first + count]`` (batch rows)."""

    table: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor
    first: torch.Tensor
    count: torch.Tensor
    members: torch.Tensor

    @property
    def slots(self) -> int:
        return self.table.shape[0]


@triton.jit
def _score_segments_kernel(
    q_ptr, stride_qb, stride_qh,
    mu_ptr, mu_scale_ptr, basis_ptr, coef_ptr, coef_scale_ptr,
    req_to_token_ptr, stride_rt, req_pool_ptr,
    seg_table_ptr, seg_start_ptr, seg_end_ptr, seg_first_ptr, seg_count_ptr, members_ptr,
    scores_ptr, part_max_ptr, part_sum_ptr, part_stride, part_first,
    max_pages, n_chunks, scale_log2,
    HKV: tl.constexpr, G: tl.constexpr, GQ: tl.constexpr, MB: tl.constexpr, D: tl.constexpr, R: tl.constexpr,
    RP: tl.constexpr, PAGE: tl.constexpr, BLOCK_P: tl.constexpr, QUANT: tl.constexpr, CVT: tl.constexpr,
    BIG: tl.constexpr,
):
    seg = tl.program_id(0)
    h = tl.program_id(1) % HKV
    mblock = tl.program_id(1) // HKV
    chunk = tl.program_id(2)
    HALF: tl.constexpr = D // 2
    CB: tl.constexpr = MB * GQ  # tile rows: MB members x their G query heads (padded to GQ)

    count = tl.load(seg_count_ptr + seg)
    seg_start = tl.load(seg_start_ptr + seg)
    seg_end = tl.maximum(tl.minimum(tl.load(seg_end_ptr + seg), max_pages), seg_start)
    # A member block past the segment's members scores nothing.
    n_items = tl.where(mblock * MB < count, seg_end - seg_start, 0)
    row_chunk = tl.cdiv(tl.cdiv(n_items, n_chunks), BLOCK_P) * BLOCK_P
    start = seg_start + chunk * row_chunk
    end = tl.minimum(start + row_chunk, seg_start + n_items)
    table = req_to_token_ptr + tl.load(req_pool_ptr + tl.load(seg_table_ptr + seg)).to(tl.int64) * stride_rt

    c = tl.arange(0, CB)
    m = mblock * MB + c // GQ
    g = c % GQ
    live = (m < count) & (g < G)
    b = tl.load(members_ptr + tl.load(seg_first_ptr + seg) + m, mask=m < count, other=0)
    k = tl.arange(0, HALF)
    q_rows = q_ptr + b.to(tl.int64) * stride_qb + (h * G + g) * stride_qh
    q_lo = _to_dot_dtype(tl.load(q_rows[:, None] + k[None, :], mask=live[:, None], other=0.0), CVT)
    q_hi = _to_dot_dtype(tl.load(q_rows[:, None] + HALF + k[None, :], mask=live[:, None], other=0.0), CVT)
    out_rows = (b * HKV * G + h * G + g).to(tl.int64)

    run_m = tl.full((CB,), float("-inf"), tl.float32)
    run_s = tl.zeros((CB,), tl.float32)
    jp = tl.arange(0, BLOCK_P)
    n = tl.arange(0, BLOCK_P * RP)  # basis column (page j, rank r) = (n // RP, n % RP)
    e = tl.arange(0, RP * PAGE)
    r_n = n % RP
    live_r = r_n < R
    last = tl.maximum(end - 1, 0)
    for p0 in range(start, end, BLOCK_P):
        p = p0 + jp
        valid = p < end
        slot = tl.load(table + tl.minimum(p, last) * PAGE)
        rec = slot // PAGE * HKV + h
        if BIG:
            rec = rec.to(tl.int64)
        qmu = _centroid_term(q_lo, q_hi, mu_ptr + rec[None, :] * D + k[:, None], tl.load(mu_scale_ptr + rec),
                             scale_log2, HALF, QUANT, CVT)
        rec_n = tl.reshape(tl.broadcast_to(rec[:, None], (BLOCK_P, RP)), (BLOCK_P * RP,))
        row_n = rec_n * R + r_n
        cs = tl.load(coef_scale_ptr + row_n, mask=live_r, other=0.0)
        proj = _basis_term(q_lo, q_hi, basis_ptr, row_n, live_r, k, cs, scale_log2, D, QUANT, CVT)
        c_rows = tl.load(coef_ptr + rec[:, None] * (R * PAGE) + e[None, :], mask=(e < R * PAGE)[None, :], other=0)
        s2 = _page_lse(proj, c_rows, CB, CB, BLOCK_P, RP, PAGE, QUANT, CVT) + qmu
        s2 = tl.where(valid[None, :], s2, float("-inf"))
        tl.store(scores_ptr + out_rows[:, None] * max_pages + p[None, :], s2 * LN2, mask=live[:, None] & valid[None, :])
        bm = tl.maximum(run_m, tl.max(s2, 1))
        run_s = run_s * tl.exp2(run_m - bm) + tl.sum(tl.exp2(s2 - bm[:, None]), 1)
        run_m = bm

    part = out_rows * part_stride + part_first + chunk
    tl.store(part_max_ptr + part, run_m * LN2, mask=live)
    tl.store(part_sum_ptr + part, run_s, mask=live)


SHARED_TILE_ROWS = 64  # query rows of a shared run's tiles
OWN_TILE_ROWS = 16  # a segment of one member: the smallest tile a dot takes


def members_per_tile(group: int, tile_rows: int) -> int:
    """Members whose G query heads (padded to a power of two) share a tile of tile_rows rows (at least one)."""
    if tile_rows < 16 or tile_rows & (tile_rows - 1):
        raise ValueError(f"tile_rows must be a power of two >= 16, got {tile_rows}")
    return max(1, tile_rows // triton.next_power_of_2(group))


def score_segments_triton(q, summaries, req_to_token, req_pool_indices, segments: Segments, max_pages: int,
                          sm_scale: float, out, part_first: int = 0, tile_rows: int = SHARED_TILE_ROWS,
                          chunk_pages: int = None, num_warps: int = 4, num_stages: int = 2) -> int:
    """Score every segment's pages for its members into out = (scores [B, Hq, max_pages], part_max, part_sum
    [B, Hq, >= part_first + n_chunks]), this launch's chunk partials at columns [part_first, part_first +
    n_chunks); returns n_chunks. tile_rows: query rows of a tile (a power of two >= 16), the query heads of
    tile_rows // G members (at least one; 16 for segments of one member); chunk_pages: pages per program
    (default: enough programs to fill the GPU)."""
    bsz, hq, d = q.shape
    hkv, rank = summaries.num_kv_heads, summaries.rank
    group = hq // hkv
    if hq % hkv or not 1 <= group <= MAX_GROUP:
        raise ValueError(f"query heads per KV head must be 1..{MAX_GROUP}, got {hq} on {hkv}")
    padded = triton.next_power_of_2(group)
    mb = members_per_tile(group, tile_rows)
    rank_p = triton.next_power_of_2(rank)
    if BLOCK_PAGES * rank_p < 16:
        raise ValueError(f"rank {rank} too small for blocks of {BLOCK_PAGES} pages")
    scores, part_max, part_sum = out
    chunk_pages = chunk_pages or chunk_pages_for(segments.slots * hkv, max_pages, q.device)
    n_chunks = max(1, triton.cdiv(max_pages, chunk_pages))
    if scores.shape != (bsz, hq, max_pages) or part_max.shape[:2] != (bsz, hq) or part_sum.shape != part_max.shape:
        raise ValueError(f"out must be scores [{bsz}, {hq}, {max_pages}] and two partials [{bsz}, {hq}, C], got "
                         f"{tuple(scores.shape)}, {tuple(part_max.shape)}, {tuple(part_sum.shape)}")
    if part_first + n_chunks > part_max.shape[-1]:
        raise ValueError(f"chunks [{part_first}, {part_first + n_chunks}) exceed the partials' {part_max.shape[-1]}")
    if q.stride(2) != 1:
        q = q.contiguous()
    member_blocks = triton.cdiv(bsz, mb)
    s = segments
    _score_segments_kernel[(s.slots, hkv * member_blocks, n_chunks)](
        q, q.stride(0), q.stride(1),
        summaries.mu, summaries.mu_scale, summaries.basis, summaries.coef, summaries.coef_scale,
        req_to_token, req_to_token.stride(0), req_pool_indices,
        s.table, s.start, s.end, s.first, s.count, s.members,
        scores, part_max, part_sum, part_max.shape[-1], part_first,
        max_pages, n_chunks, sm_scale * 1.4426950408889634,
        HKV=hkv, G=group, GQ=padded, MB=mb, D=d, R=rank, RP=rank_p, PAGE=16, BLOCK_P=BLOCK_PAGES,
        QUANT=summaries.quantized, CVT=0 if interpreted() else CONVERSIONS["ptx"],
        BIG=summaries.basis.numel() >= 2**31,
        num_warps=num_warps, num_stages=num_stages,
    )
    return n_chunks
