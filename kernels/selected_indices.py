"""selected_indices: top pages of each (request, KV head) -> FlashInfer page-size-1 token indices.

Row (b, h) of the sparse decode attends the selected sealed pages (all of them,
in logical order, when they fit in the budget) and then the unsealed tail
tokens. The KV cache [slots, H_kv, d] is viewed as [slots * H_kv, 1, 1, d], so
token slot s of KV head h is entry s * H_kv + h.

Top-k is a radix select on 16-bit page keys (aggregate_scores.page_key: the
page's share of its group's estimated mass in steps of 2^-10 nats), spread
over chunks of CHUNK pages, one program each: aggregate_scores counted the
keys' high bytes per row; a count pass histograms, per chunk, the low bytes of
the keys in the boundary bin; the write pass derives the k-th largest key T,
and each chunk takes its pages with key > T plus, in page order, as many with
key == T as the budget still holds, at positions that follow from the
earlier chunks' counts. Pages come out in logical order; the selection is
deterministic and the exact top-k up to ties within 2^-10 nats.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .aggregate_scores import HIST_BINS

CHUNK = 1024  # pages per program


@triton.jit
def _kth_bin(hist, k):
    """Bin holding the k-th largest key of a histogram, and how many keys lie in higher bins."""
    bins = tl.arange(0, HIST_BINS)
    above = tl.sum(hist, 0) - tl.cumsum(hist, 0)
    kth = tl.max(tl.where(above + hist >= k, bins, -1), 0)
    return kth, tl.sum(tl.where(bins > kth, hist, 0), 0)


@triton.jit
def _write_pages(pages, live, pos, req_to_token_ptr, stride_rt, req, indices_ptr, base, h,
                 HKV: tl.constexpr, PAGE: tl.constexpr):
    t = tl.arange(0, PAGE)
    slot = tl.load(req_to_token_ptr + req * stride_rt + pages[:, None] * PAGE + t[None, :], mask=live[:, None], other=0)
    tl.store(indices_ptr + base + pos[:, None] * PAGE + t[None, :], slot * HKV + h, mask=live[:, None])


@triton.jit
def _count_kernel(keys_ptr, stride_k, hist_ptr, low_ptr, above_ptr, seq_lens_ptr, n_chunks, budget_pages,
                  HKV: tl.constexpr, PAGE: tl.constexpr, CH: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    n_sealed = tl.load(seq_lens_ptr + row // HKV) // PAGE
    if (n_sealed > budget_pages) & (c * CH < n_sealed):
        bins = tl.arange(0, HIST_BINS)
        hi, _ = _kth_bin(tl.load(hist_ptr + row * HIST_BINS + bins), budget_pages)
        p = c * CH + tl.arange(0, CH)
        valid = p < n_sealed
        key = tl.load(keys_ptr + row.to(tl.int64) * stride_k + p, mask=valid, other=-1)
        low = tl.histogram(key & 255, HIST_BINS, mask=valid & ((key >> 8) == hi))
        tl.store(low_ptr + (row * n_chunks + c).to(tl.int64) * HIST_BINS + bins, low)
        tl.store(above_ptr + row * n_chunks + c, tl.sum((valid & ((key >> 8) > hi)).to(tl.int32), 0))


@triton.jit
def _write_kernel(
    keys_ptr, stride_k, hist_ptr, low_ptr, above_ptr,
    req_to_token_ptr, stride_rt, req_pool_ptr, seq_lens_ptr, indptr_ptr, indices_ptr, n_chunks, budget_pages,
    HKV: tl.constexpr, PAGE: tl.constexpr, CH: tl.constexpr, CHUNKS_P2: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.program_id(1)
    b = row // HKV
    h = row % HKV
    seq_len = tl.load(seq_lens_ptr + b)
    n_sealed = seq_len // PAGE
    req = tl.load(req_pool_ptr + b).to(tl.int64)
    base = tl.load(indptr_ptr + row).to(tl.int64)
    count = tl.minimum(n_sealed, budget_pages)
    p = c * CH + tl.arange(0, CH)
    valid = p < n_sealed
    if n_sealed <= budget_pages:
        _write_pages(p, valid, p, req_to_token_ptr, stride_rt, req, indices_ptr, base, h, HKV, PAGE)
    elif c * CH < n_sealed:
        bins = tl.arange(0, HIST_BINS)
        hi, above_hi = _kth_bin(tl.load(hist_ptr + row * HIST_BINS + bins), budget_pages)
        cc = tl.arange(0, CHUNKS_P2)
        used = cc < (n_sealed + CH - 1) // CH
        lows = tl.load(low_ptr + (row * n_chunks + cc[:, None]).to(tl.int64) * HIST_BINS + bins[None, :],
                       mask=used[:, None], other=0)                                  # [chunks, 256]
        lo, above_lo = _kth_bin(tl.sum(lows, 0), budget_pages - above_hi)
        thr = hi * 256 + lo
        ties = budget_pages - above_hi - above_lo   # pages with key == thr to take, in page order
        # Per chunk: keys above thr, keys equal to it; summed over the chunks before this one.
        above_c = tl.load(above_ptr + row * n_chunks + cc, mask=used, other=0)
        above_c += tl.sum(tl.where(bins[None, :] > lo, lows, 0), 1)
        ties_c = tl.sum(tl.where(bins[None, :] == lo, lows, 0), 1)
        before = cc < c
        ties_before = tl.sum(tl.where(before, ties_c, 0), 0)
        taken_before = tl.sum(tl.where(before, above_c, 0), 0) + tl.minimum(ties_before, ties)
        key = tl.load(keys_ptr + row.to(tl.int64) * stride_k + p, mask=valid, other=-1)
        tie = (valid & (key == thr)).to(tl.int32)
        take = (valid & (key > thr)) | ((tie != 0) & (ties_before + tl.cumsum(tie, 0) - tie < ties))
        take_i = take.to(tl.int32)
        pos = taken_before + tl.cumsum(take_i, 0) - take_i
        _write_pages(p, take, pos, req_to_token_ptr, stride_rt, req, indices_ptr, base, h, HKV, PAGE)
    if c == 0:
        t = tl.arange(0, PAGE)
        tail = seq_len - n_sealed * PAGE
        slot = tl.load(req_to_token_ptr + req * stride_rt + n_sealed * PAGE + t, mask=t < tail, other=0)
        tl.store(indices_ptr + base + count * PAGE + t, slot * HKV + h, mask=t < tail)


def selected_indices_triton(keys, hist, req_to_token, req_pool_indices, seq_lens, indptr, indices, num_kv_heads,
                            budget_pages):
    """keys [B * H_kv, P] and hist [B * H_kv, 256] from aggregate_scores_triton(keys=True).
    Writes the token indices of every row at indptr (top pages in logical order, then the tail)."""
    rows, max_pages = keys.shape
    n_chunks = max(1, triton.cdiv(max_pages, CHUNK))
    low = torch.empty(rows, n_chunks, HIST_BINS.value, dtype=torch.int32, device=keys.device)
    above = torch.empty(rows, n_chunks, dtype=torch.int32, device=keys.device)
    grid = (rows, n_chunks)
    _count_kernel[grid](keys, keys.stride(0), hist, low, above, seq_lens, n_chunks, budget_pages,
                        HKV=num_kv_heads, PAGE=16, CH=CHUNK, num_warps=4)
    _write_kernel[grid](
        keys, keys.stride(0), hist, low, above,
        req_to_token, req_to_token.stride(0), req_pool_indices, seq_lens, indptr, indices, n_chunks, budget_pages,
        HKV=num_kv_heads, PAGE=16, CH=CHUNK, CHUNKS_P2=triton.next_power_of_2(n_chunks), num_warps=8,
    )
    return indices


def select_pages_by_key_torch(agg, key_offset, budget_pages):
    """Reference of the kernel's top-k: per row the pages with the budget_pages largest keys,
    ties at the k-th key taken in page order; logical page ids [B * H_kv, k] in ascending order."""
    from .aggregate_scores import page_key_torch

    rows = agg.shape[0] * agg.shape[1]
    flat = agg.reshape(rows, -1)
    keys = page_key_torch(flat, key_offset)
    keys = torch.where(flat == float("-inf"), torch.full_like(keys, -1), keys)  # padding never competes
    k = min(budget_pages, flat.shape[1])
    out = torch.zeros(rows, k, dtype=torch.int64)
    for row in range(rows):
        kth = keys[row].topk(k).values[-1] if k else 0
        above = (keys[row] > kth).nonzero().flatten()
        ties = (keys[row] == kth).nonzero().flatten()[: k - above.numel()]
        out[row] = torch.cat([above, ties]).sort().values
    return out


def selected_indices_torch(sel, req_to_token, req_pool_indices, seq_lens, num_kv_heads, budget_pages):
    """Reference: top-k pages sel [B * H_kv, >= budget_pages] -> (indptr [rows + 1], indices), row by row."""
    out, lens = [], []
    for b in range(seq_lens.shape[0]):
        seq_len = int(seq_lens[b])
        n_sealed = seq_len // 16
        table = req_to_token[int(req_pool_indices[b])].long()
        for h in range(num_kv_heads):
            row = b * num_kv_heads + h
            pages = torch.arange(n_sealed) if n_sealed <= budget_pages else sel[row, :budget_pages].long().cpu()
            pos = (pages[:, None] * 16 + torch.arange(16)).reshape(-1)
            pos = torch.cat([pos, torch.arange(n_sealed * 16, seq_len)]).to(table.device)
            out.append(table[pos] * num_kv_heads + h)
            lens.append(pos.numel())
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.tensor(lens).cumsum(0)
    return indptr, torch.cat(out).to(torch.int32)
