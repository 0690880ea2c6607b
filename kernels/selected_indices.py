"""selected_indices: FlashInfer page-size-1 indices of the tokens each (request, KV head) attends.

Row (b, h) of the sparse decode attends, in this order, the selected sealed
pages (all of them, in logical order, when they fit in the budget) and then
the unsealed tail tokens. The KV cache [slots, H_kv, d] is viewed as
[slots * H_kv, 1, 1, d], so token slot s of KV head h is entry s * H_kv + h.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _selected_indices_kernel(
    sel_ptr, stride_sel, req_to_token_ptr, stride_rt, req_pool_ptr, seq_lens_ptr,
    indptr_ptr, indices_ptr, budget_pages,
    HKV: tl.constexpr, PAGE: tl.constexpr, BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0)
    b = row // HKV
    h = row % HKV
    seq_len = tl.load(seq_lens_ptr + b)
    n_sealed = seq_len // PAGE
    count = tl.minimum(n_sealed, budget_pages)
    req = tl.load(req_pool_ptr + b).to(tl.int64)
    base = tl.load(indptr_ptr + row).to(tl.int64)
    t = tl.arange(0, PAGE)
    for start in range(0, count, BLOCK_K):
        i = start + tl.arange(0, BLOCK_K)
        live = i < count
        if n_sealed <= budget_pages:
            page = i
        else:
            page = tl.load(sel_ptr + row.to(tl.int64) * stride_sel + i, mask=live, other=0).to(tl.int32)
        pos = page[:, None] * PAGE + t[None, :]
        slot = tl.load(req_to_token_ptr + req * stride_rt + pos, mask=live[:, None], other=0)
        tl.store(indices_ptr + base + i[:, None] * PAGE + t[None, :], slot * HKV + h, mask=live[:, None])
    tail = seq_len - n_sealed * PAGE
    slot = tl.load(req_to_token_ptr + req * stride_rt + n_sealed * PAGE + t, mask=t < tail, other=0)
    tl.store(indices_ptr + base + count * PAGE + t, slot * HKV + h, mask=t < tail)


def selected_indices_triton(sel, req_to_token, req_pool_indices, seq_lens, indptr, indices, num_kv_heads, budget_pages):
    """sel [B * H_kv, >= budget_pages] logical page ids (top-k output); writes into indices."""
    rows = seq_lens.shape[0] * num_kv_heads
    _selected_indices_kernel[(rows,)](
        sel, sel.stride(0), req_to_token, req_to_token.stride(0), req_pool_indices, seq_lens,
        indptr, indices, budget_pages,
        HKV=num_kv_heads, PAGE=16, BLOCK_K=min(128, triton.next_power_of_2(max(budget_pages, 1))),
        num_warps=4,
    )
    return indices


def selected_indices_torch(sel, req_to_token, req_pool_indices, seq_lens, num_kv_heads, budget_pages):
    """Reference: returns (indptr [rows + 1], indices) built row by row."""
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
