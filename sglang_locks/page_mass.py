"""Exact attention mass per page of a decode query, and the share of it a selection attended.

A row is one (request, KV head) of a decode step, as in the sparse decode
(sparse_decode.py): the request's G query heads over its seq_len cached
tokens of that KV head. Each query head's exact attention (softmax of
q . k * sm_scale over all of the row's tokens) is summed per logical
16-token page and normalised per head; the row's page mass is the mean over
its G heads, the group's summed normalised mass that the selection ranks by
(aggregate_scores, "mass") divided by G, so a row's masses sum to 1. The
share the row attended (``attended_share``) is therefore the mean over its
query heads of the recall ``sglang_locks.evaluate`` reports per query head.

Attended pages come from the sparse decode's own entries (indptr/indices:
entry slot * H_kv + h is the page of head h whose first token is slot), so
the audit measures what the kernel read, tail page included. Everything is
vectorised torch on static shapes: no host sync.
"""

from __future__ import annotations

import torch

from .config import PAGE_SIZE

CHUNK_VALUES = 1 << 24  # gathered key elements per chunk (64 MiB in float32)
_ROW_SHIFT = 32  # attended-page keys: row << 32 | physical page


def page_mass(q: torch.Tensor, k_cache: torch.Tensor, tables: torch.Tensor, seq_lens: torch.Tensor, max_tokens: int,
              sm_scale: float, chunk_values: int = CHUNK_VALUES) -> torch.Tensor:
    """Exact mass per logical page [B, H_kv, P] (float32, each row sums to 1; P = ceil(max_tokens / 16)).

    q [B, Hq, d]; k_cache [slots, H_kv, d]; tables [B, >= seq_len] the requests' token slots (req_to_token
    rows); seq_lens [B] on the device; max_tokens >= every seq_len, a host int (the loop's extent)."""
    bsz, hq, d = q.shape
    hkv = k_cache.shape[1]
    pages = -(-max_tokens // PAGE_SIZE)
    width = tables.shape[1]
    chunk = max(PAGE_SIZE, chunk_values // max(1, bsz * hkv * d) // PAGE_SIZE * PAGE_SIZE)
    qf = q.float().view(bsz, hkv, hq // hkv, d) * sm_scale
    page_lse = torch.empty(bsz, hkv, hq // hkv, pages, dtype=torch.float32, device=q.device)
    lens = seq_lens.to(torch.int64)[:, None]
    for start in range(0, pages * PAGE_SIZE, chunk):
        pos = torch.arange(start, min(start + chunk, pages * PAGE_SIZE), device=q.device)
        slots = tables[:, pos.clamp(max=width - 1)].to(torch.int64)  # [B, C]
        logits = torch.einsum("bhgd,bchd->bhgc", qf, k_cache[slots].float())
        logits = logits.masked_fill(~(pos[None, :] < lens)[:, None, None, :], float("-inf"))
        page_lse[..., start // PAGE_SIZE : start // PAGE_SIZE + pos.numel() // PAGE_SIZE] = (
            logits.unflatten(-1, (-1, PAGE_SIZE)).logsumexp(-1))
    head_lse = page_lse.logsumexp(-1, keepdim=True)
    return torch.exp(page_lse - head_lse).mean(2)


def attended_pages(tables: torch.Tensor, pages: int, indptr: torch.Tensor, indices: torch.Tensor,
                   num_kv_heads: int) -> torch.Tensor:
    """[B, H_kv, pages] bool: logical page j of row (b, h) is among the row's entries.

    tables [B, ...] the requests' token slots; indptr [>= B * H_kv + 1] and indices (entries of those rows at
    indptr, any further ones ignored) as the sparse decode reads them. An entry of another KV head than its
    row's attends nothing of the row."""
    bsz = tables.shape[0]
    rows = bsz * num_kv_heads
    device = indices.device
    entries = indices.to(torch.int64)
    pos = torch.arange(entries.numel(), device=device)
    row = torch.searchsorted(indptr[1 : rows + 1].to(torch.int64), pos, right=True)
    valid = (pos < indptr[rows]) & (entries % num_kv_heads == row % num_kv_heads)
    phys = entries // num_kv_heads // PAGE_SIZE
    keys = torch.where(valid, (row << _ROW_SHIFT) | phys, torch.full_like(phys, -1)).sort().values
    j = torch.arange(pages, device=device)
    first = tables[:, (j * PAGE_SIZE).clamp(max=tables.shape[1] - 1)].to(torch.int64) // PAGE_SIZE  # [B, pages]
    row_ids = torch.arange(rows, device=device).view(bsz, num_kv_heads, 1)
    want = (row_ids << _ROW_SHIFT) | first[:, None, :]
    if keys.numel() == 0:
        return torch.zeros_like(want, dtype=torch.bool)
    found = torch.searchsorted(keys, want.flatten()).clamp(max=keys.numel() - 1)
    return (keys[found] == want.flatten()).view_as(want)


def attended_share(mass: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
    """[B, H_kv]: the share of each row's exact mass on its attended pages (pages past seq_len hold none)."""
    return (mass * attended).sum(-1)


def attended_share_reference(q, k_cache, tables, seq_lens, indptr, indices, sm_scale: float) -> torch.Tensor:
    """Float64 reference of attended_share(page_mass(...), attended_pages(...)), row by row, token by token."""
    bsz, hq, d = q.shape
    hkv = k_cache.shape[1]
    group = hq // hkv
    out = torch.empty(bsz, hkv, dtype=torch.float64)
    for b in range(bsz):
        n = int(seq_lens[b])
        slots = tables[b, :n].long().cpu()
        for h in range(hkv):
            row = b * hkv + h
            entries = indices[int(indptr[row]) : int(indptr[row + 1])].long().cpu()
            held = {int(e) // hkv // PAGE_SIZE for e in entries if int(e) % hkv == h}
            kept = torch.tensor([int(s) // PAGE_SIZE in held for s in slots[::PAGE_SIZE]])
            kept = kept.repeat_interleave(PAGE_SIZE)[:n]
            k = k_cache[slots, h].double().cpu()
            p = torch.softmax(q[b, h * group : (h + 1) * group].double().cpu() @ k.T * sm_scale, -1)  # [G, n]
            out[b, h] = (p * kept).sum(-1).mean()
    return out
