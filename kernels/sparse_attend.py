"""sparse_attend: exact attention of each (request, KV head) row over its selected pages, split over the pages.

Same rows and entries as the FlashInfer path (sparse_decode.SparseDecodeWrapper):
row b * H_kv + h holds request b's KV head h with its G query heads; its
entries indices[indptr[row]:indptr[row + 1]] are pages of that head in the
token-major cache [slots, H_kv, d] (entry slot * H_kv + h is the page whose
first token is slot, its tokens H_kv * d elements apart); its last page holds
last_page_len[row] tokens.

Why not FlashInfer's decode: at budget 2048 a row is ~130 pages, which its
batch decode and merge read slower than their bytes allow whatever the split
settings, and it needs a host plan. Here each row's pages are cut into
`splits` equal parts, one program each (enough programs to fill the GPU), and
a second launch merges the parts' (output, log-sum-exp) per query head; with
one part the first launch writes the output itself. It is the faster of the
two on the H200 (docs/performance.md); merging in the row's last program
instead of a second launch measured slower.
Both launches take programmatic dependent launch (_triton.DEPENDENT_KERNELS): each is scheduled while the
kernel before it runs.

An fp8 cache (float8_e4m3fn pages holding K / k_scale and V / v_scale, SGLang's
--kv-cache-dtype fp8_e4m3) is widened to q's dtype after the load (exact: every
e4m3 value is a bf16 and an fp16 value), k_scale folded into the softmax scale
and v_scale into each part's output (the merge is linear in them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._triton import L2_KEEP, dependent_launch, interpreted, pdl_start
from .score_pages import LOG2E

PAGE = tl.constexpr(16)  # tokens per page (config.PAGE_SIZE; kernels do not import the package's config)


@triton.jit
def _attend_part(q_ptr, k_ptr, v_ptr, indptr, indices, last_page_len, out_ptr, part_o, part_lse, qk_scale, v_scale,
                 HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
                 PAGES: tl.constexpr, SPLITS: tl.constexpr, DOT_F32: tl.constexpr, PDL: tl.constexpr,
                 KEEP: tl.constexpr):
    """Program (row, split): the row's G query heads over one part of its pages (parts stored with L2 eviction
    policy KEEP)."""
    pdl_start(PDL)
    row = tl.program_id(0)
    split = tl.program_id(1)
    start = tl.load(indptr + row)
    end = tl.load(indptr + row + 1)
    per = tl.cdiv(end - start, SPLITS)
    lo = start + split * per
    hi = tl.minimum(lo + per, end)
    last = tl.load(last_page_len + row)

    heads = tl.arange(0, GP)
    dims = tl.arange(0, DP)  # head_dim padded to a power of two
    live = (heads < G)[:, None] & (dims < D)[None, :]
    q = tl.load(q_ptr + (row * G + heads)[:, None] * D + dims[None, :], mask=live, other=0.0)
    if DOT_F32:  # Triton's interpreter multiplies 16-bit floats wrongly
        q = q.to(tl.float32)

    tok = tl.arange(0, PAGES * PAGE)
    within = tok % PAGE
    m = tl.full([GP], -1.0e30, tl.float32)  # finite: an empty part must not make inf - inf
    l = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, DP], tl.float32)
    for p0 in range(lo, hi, PAGES):
        page = p0 + tok // PAGE
        valid = (page < hi) & ((page < end - 1) | (within < last))
        entry = tl.load(indices + page, mask=page < hi, other=0).to(tl.int64)
        offs = (entry * D + within * (HKV * D))[:, None] + dims[None, :]
        kv_mask = valid[:, None] & (dims < D)[None, :]
        k = tl.load(k_ptr + offs, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + offs, mask=kv_mask, other=0.0)
        if DOT_F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        else:  # fp8 pages: the tensor cores take operands of one type (a no-op for 16-bit pages)
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # log2 domain
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new

    o = acc / tl.maximum(l, 1.0e-30)[:, None] * v_scale
    if SPLITS == 1:
        tl.store(out_ptr + (row * G + heads)[:, None] * D + dims[None, :], o.to(out_ptr.dtype.element_ty), mask=live)
    else:
        part = (row * SPLITS + split) * G + heads
        tl.store(part_o + part[:, None] * D + dims[None, :], o, mask=live, eviction_policy=KEEP)
        tl.store(part_lse + part, tl.where(l > 0, m + tl.log2(l), float("-inf")), mask=heads < G,
                 eviction_policy=KEEP)


@triton.jit
def _merge_parts(part_o, part_lse, out_ptr, G: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, SPLITS: tl.constexpr,
                 PDL: tl.constexpr):
    """Program (row, query head): its parts' outputs weighted by their softmax mass."""
    pdl_start(PDL)
    row = tl.program_id(0)
    g = tl.program_id(1)
    parts = tl.arange(0, SPLITS)
    dims = tl.arange(0, DP)
    idx = (row * SPLITS + parts) * G + g
    lse = tl.load(part_lse + idx)
    # empty parts weigh 0; a row without pages (no part finite) gets zeros, as with one part
    w = tl.where(lse > float("-inf"), tl.exp2(lse - tl.max(lse, 0)), 0.0)
    o = tl.load(part_o + idx[:, None] * D + dims[None, :], mask=(dims < D)[None, :], other=0.0)
    res = tl.sum(o * w[:, None], 0) / tl.maximum(tl.sum(w, 0), 1.0e-30)
    tl.store(out_ptr + (row * G + g) * D + dims, res.to(out_ptr.dtype.element_ty), mask=dims < D)


class SparseAttendBuffers:
    """Where sparse_attend_triton keeps its rows' parts: float32 outputs [row parts * G, d] and log-sum-exps
    [row parts * G], for up to `capacity` (row, part) pairs. Static under CUDA graphs."""

    def __init__(self, part_o: torch.Tensor, part_lse: torch.Tensor, group: int) -> None:
        self.part_o, self.part_lse = part_o, part_lse
        self.capacity = part_lse.numel() // group

    @classmethod
    def allocate(cls, row_parts: int, group: int, head_dim: int, device) -> "SparseAttendBuffers":
        n = row_parts * group
        return cls(torch.empty(n, head_dim, dtype=torch.float32, device=device),
                   torch.empty(n, dtype=torch.float32, device=device), group)

    @classmethod
    def in_workspace(cls, workspace: torch.Tensor, group: int, head_dim: int) -> "SparseAttendBuffers":
        """As many row parts as a uint8 workspace holds (a 128 MiB one: 65K at G = 4, d = 128)."""
        n = workspace.numel() // (4 * (head_dim + 1) * group) * group
        flat = workspace[: 4 * n * (head_dim + 1)].view(torch.float32)
        return cls(flat[: n * head_dim].view(n, head_dim), flat[n * head_dim:], group)


def sparse_attend_triton(q, k_cache, v_cache, indptr, indices, last_page_len, rows: int, splits: int,
                         sm_scale: float, buffers: SparseAttendBuffers = None, out=None, pages_per_iter: int = 4,
                         k_scale: float = 1.0, v_scale: float = 1.0):
    """q [B, Hq, d] (bf16 or fp16); k_cache/v_cache [slots, H_kv, d] in q's dtype or float8_e4m3fn; rows = B * H_kv
    -> out [B, Hq, d] in q's dtype.

    splits: parts per row (a power of two) and pages_per_iter: pages a program loads at once (attend_launch).
    k_scale, v_scale: the cache holds K / k_scale and V / v_scale (SGLang's fp8 cache; 1.0: the keys and values).
    """
    bsz, hq, d = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    if k_cache.stride() != (hkv * d, d, 1) or v_cache.stride() != k_cache.stride():
        raise ValueError("the KV cache must be contiguous [slots, H_kv, d] tensors")
    if splits < 1 or splits & (splits - 1):
        raise ValueError(f"splits must be a power of two, got {splits}")
    if splits > 1:
        if buffers is None:
            buffers = SparseAttendBuffers.allocate(rows * splits, g, d, q.device)
        if rows * splits > buffers.capacity:
            raise ValueError(f"buffers hold {buffers.capacity} row parts: got {rows} rows of {splits}")
        part_o, part_lse = buffers.part_o, buffers.part_lse
    else:
        part_o = part_lse = q  # unused: one part writes the output itself
    if (q.dtype not in (torch.bfloat16, torch.float16) or k_cache.dtype != v_cache.dtype
            or k_cache.dtype not in (q.dtype, torch.float8_e4m3fn)):
        raise ValueError(f"q and the KV cache must be bf16 or fp16 of one dtype, or the cache torch.float8_e4m3fn, got "
                         f"{q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    dp = max(16, triton.next_power_of_2(d))
    q = q.contiguous()
    if out is None:
        out = torch.empty_like(q)
    _attend_part[(rows, splits)](q, k_cache, v_cache, indptr, indices, last_page_len, out, part_o, part_lse,
                                 sm_scale * k_scale * LOG2E, v_scale, HKV=hkv, G=g,
                                 GP=max(16, triton.next_power_of_2(g)), D=d, DP=dp, PAGES=pages_per_iter, SPLITS=splits,
                                 DOT_F32=interpreted(), num_warps=4, KEEP=L2_KEEP,
                                 **dependent_launch(q.device, "attend"))
    if splits > 1:
        _merge_parts[(rows, g)](part_o, part_lse, out, G=g, D=d, DP=dp, SPLITS=splits, num_warps=4,
                                **dependent_launch(q.device, "merge"))
    return out


def attend_launch(rows: int, pages_per_row: int, sms: int):
    """(splits, pages_per_iter) for rows of up to pages_per_row pages: about two programs per SM, each of 4 pages
    (64 tokens) or more, at most 64 parts; 8 pages loaded at once where a part holds at most 8, else 4 (the
    faster of each at budget 2048 on the H200)."""
    want = triton.next_power_of_2(max(1, -(-2 * sms // max(1, rows))))
    cap = 1 << max(0, (max(1, pages_per_row // 4)).bit_length() - 1)
    splits = max(1, min(want, cap, 64))
    return splits, 8 if -(-pages_per_row // splits) <= 8 else 4
