"""selected_indices: top pages of each (request, KV head) -> FlashInfer page-size-1 token indices.

Row (b, h) of the sparse decode attends the selected sealed pages (all of them,
in logical order, when they fit in the budget) and then the unsealed tail
tokens. The KV cache [slots, H_kv, d] is viewed as [slots * H_kv, 1, 1, d], so
token slot s of KV head h is entry s * H_kv + h.

Top-k, one program per row: the aggregation kernel left each chunk's top-k
candidates as packed (16-bit page key, page) words (aggregate_scores.page_key:
the page's share of its group's estimated mass in steps of 2^-10 nats); a
running bitonic top-k over them, a block at a time, keeps the row's k best,
which are written in logical page order. Ties at the k-th key go to the
smaller pages, so the selection is deterministic: the exact top-k up to ties
within 2^-10 nats.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Row-level top-k words: key above PAGE_BITS bits of (MAX_PAGE - page), so larger keys,
# then smaller pages, come first.
PAGE_BITS = tl.constexpr(28)
MAX_PAGE = tl.constexpr((1 << 28) - 1)
CAND_BLOCK = 2048  # candidates merged per step


@triton.jit
def _write_pages(pages, live, pos, req_to_token_ptr, stride_rt, req, indices_ptr, base, h,
                 HKV: tl.constexpr, PAGE: tl.constexpr):
    t = tl.arange(0, PAGE)
    slot = tl.load(req_to_token_ptr + req * stride_rt + pages[:, None] * PAGE + t[None, :], mask=live[:, None], other=0)
    tl.store(indices_ptr + base + pos[:, None] * PAGE + t[None, :], slot * HKV + h, mask=live[:, None])


@triton.jit
def _selected_indices_kernel(
    cand_ptr, n_chunks, req_to_token_ptr, stride_rt, req_pool_ptr, seq_lens_ptr,
    indptr_ptr, indices_ptr, budget_pages,
    HKV: tl.constexpr, PAGE: tl.constexpr, KC: tl.constexpr, CHUNK: tl.constexpr, LOCAL_BITS: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0)
    b = row // HKV
    h = row % HKV
    seq_len = tl.load(seq_lens_ptr + b)
    n_sealed = seq_len // PAGE
    req = tl.load(req_pool_ptr + b).to(tl.int64)
    base = tl.load(indptr_ptr + row).to(tl.int64)
    count = tl.minimum(n_sealed, budget_pages)

    if n_sealed <= budget_pages:
        for start in range(0, count, BLOCK_K):
            i = start + tl.arange(0, BLOCK_K)
            _write_pages(i, i < count, i, req_to_token_ptr, stride_rt, req, indices_ptr, base, h, HKV, PAGE)
    else:
        total = (n_sealed + CHUNK - 1) // CHUNK * KC   # candidates of the chunks holding pages
        best = tl.full((KC,), -1, tl.int64)
        for start in range(0, total, BLOCK_C):
            i = start + tl.arange(0, BLOCK_C)
            word = tl.load(cand_ptr + row.to(tl.int64) * n_chunks * KC + i, mask=i < total, other=-1)
            page = (i // KC) * CHUNK + (CHUNK - 1) - (word & (CHUNK - 1))
            key = (word >> LOCAL_BITS).to(tl.int64)
            word = tl.where(word >= 0, (key << PAGE_BITS) | (MAX_PAGE - page), -1)
            best = tl.topk(tl.reshape(tl.join(best, tl.topk(word, KC)), (2 * KC,)), KC)
        k = tl.arange(0, KC)
        pages = tl.where((k < budget_pages) & (best >= 0), MAX_PAGE - (best & MAX_PAGE), MAX_PAGE)
        pages = tl.sort(pages.to(tl.int32))    # logical order: KV reads in address order
        _write_pages(pages, k < count, k, req_to_token_ptr, stride_rt, req, indices_ptr, base, h, HKV, PAGE)

    t = tl.arange(0, PAGE)
    tail = seq_len - n_sealed * PAGE
    slot = tl.load(req_to_token_ptr + req * stride_rt + n_sealed * PAGE + t, mask=t < tail, other=0)
    tl.store(indices_ptr + base + count * PAGE + t, slot * HKV + h, mask=t < tail)


def selected_indices_triton(cand, req_to_token, req_pool_indices, seq_lens, indptr, indices, num_kv_heads,
                            budget_pages, max_pages):
    """cand [B * H_kv, n_chunks, kc]: the top-k candidates aggregate_scores_triton left for
    agg [B, H_kv, max_pages]. Writes the token indices of every row at indptr (top pages in
    logical order, then the tail)."""
    from .aggregate_scores import aggregate_block

    rows, n_chunks, kc = cand.shape
    chunk = aggregate_block(budget_pages, max_pages)
    _selected_indices_kernel[(rows,)](
        cand, n_chunks, req_to_token, req_to_token.stride(0), req_pool_indices, seq_lens,
        indptr, indices, budget_pages,
        HKV=num_kv_heads, PAGE=16, KC=kc, CHUNK=chunk, LOCAL_BITS=chunk.bit_length() - 1,
        BLOCK_C=max(kc, min(CAND_BLOCK, triton.next_power_of_2(n_chunks * kc))), BLOCK_K=min(128, triton.next_power_of_2(max(budget_pages, 1))),
        num_warps=8,
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
