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

from typing import Sequence

import torch

from .config import PAGE_SIZE
from .summaries import cached_keys

CHUNK_VALUES = 1 << 24  # gathered key elements per chunk (64 MiB in float32)
_ROW_SHIFT = 32  # attended-page keys: row << 32 | physical page


def page_mass(q: torch.Tensor, k_cache: torch.Tensor, tables: torch.Tensor, seq_lens: torch.Tensor, max_tokens: int,
              sm_scale: float, k_scale: float = 1.0, chunk_values: int = CHUNK_VALUES) -> torch.Tensor:
    """Exact mass per logical page [B, H_kv, P] (float32, each row sums to 1; P = ceil(max_tokens / 16)).

    q [B, Hq, d]; k_cache [slots, H_kv, d] (16-bit, float32 or float8_e4m3fn); tables [B, >= seq_len] the
    requests' token slots (req_to_token rows); seq_lens [B] on the device; max_tokens >= every seq_len, a host
    int (the loop's extent); k_scale: an fp8 cache's, which holds keys / k_scale."""
    return layers_page_mass(q[None], [k_cache], [k_scale], tables, seq_lens, max_tokens, sm_scale, chunk_values)[0]


def layers_page_mass(q: torch.Tensor, k_caches: Sequence[torch.Tensor], k_scales: Sequence[float],
                     tables: torch.Tensor, seq_lens: torch.Tensor, max_tokens: int, sm_scale: float,
                     chunk_values: int = CHUNK_VALUES) -> torch.Tensor:
    """page_mass of L layers' queries q [L, B, Hq, d] over their caches and scales, the same requests in each:
    [L, B, H_kv, P], in one pass of launches for all layers (the audit's host time is their count)."""
    layers, bsz, hq, d = q.shape
    hkv = k_caches[0].shape[1]
    pages = -(-max_tokens // PAGE_SIZE)
    width = tables.shape[1]
    chunk = max(PAGE_SIZE, chunk_values // max(1, layers * bsz * hkv * d) // PAGE_SIZE * PAGE_SIZE)
    qf = q.float().view(layers, bsz, hkv, hq // hkv, d) * sm_scale
    page_lse = torch.empty(layers, bsz, hkv, hq // hkv, pages, dtype=torch.float32, device=q.device)
    lens = seq_lens.to(torch.int64)[:, None]
    for start in range(0, pages * PAGE_SIZE, chunk):
        pos = torch.arange(start, min(start + chunk, pages * PAGE_SIZE), device=q.device)
        slots = tables[:, pos.clamp(max=width - 1)].to(torch.int64)  # [B, C]
        keys = torch.stack([cached_keys(k, slots, None if s == 1.0 else s).float() for k, s in zip(k_caches, k_scales)])
        logits = torch.einsum("lbhgd,lbchd->lbhgc", qf, keys)
        logits = logits.masked_fill(~(pos[None, :] < lens)[None, :, None, None, :], float("-inf"))
        page_lse[..., start // PAGE_SIZE : start // PAGE_SIZE + pos.numel() // PAGE_SIZE] = (
            logits.unflatten(-1, (-1, PAGE_SIZE)).logsumexp(-1))
    head_lse = page_lse.logsumexp(-1, keepdim=True)
    return torch.exp(page_lse - head_lse).mean(3)


def attended_pages(tables: torch.Tensor, pages: int, indptr: torch.Tensor, indices: torch.Tensor,
                   num_kv_heads: int) -> torch.Tensor:
    """[B, H_kv, pages] bool: logical page j of row (b, h) is among the row's entries.

    tables [B, ...] the requests' token slots; indptr [>= B * H_kv + 1] and indices (entries of those rows at
    indptr, any further ones ignored) as the sparse decode reads them. An entry of another KV head than its
    row's attends nothing of the row."""
    return layers_attended_pages(tables, pages, indptr, indices[None], num_kv_heads)[0]


def layers_attended_pages(tables: torch.Tensor, pages: int, indptr: torch.Tensor, indices: torch.Tensor,
                          num_kv_heads: int) -> torch.Tensor:
    """attended_pages of L layers' entries indices [L, E] (E >= the rows' entries), one indptr for all (a decode
    step's): [L, B, H_kv, pages]. Layer l's entries are read at offset l * E, past the end of its rows ignored."""
    bsz = tables.shape[0]
    layers, width = indices.shape
    rows = bsz * num_kv_heads
    device = indices.device
    entries = indices.flatten().to(torch.int64)
    offsets = torch.arange(layers, device=device)[:, None] * width
    ends = (indptr[1 : rows + 1].to(torch.int64)[None, :] + offsets).flatten()  # ascending: indptr[rows] <= E
    starts = (indptr[:rows].to(torch.int64)[None, :] + offsets).flatten()
    pos = torch.arange(entries.numel(), device=device)
    row = torch.searchsorted(ends, pos, right=True)
    in_row = row.clamp(max=layers * rows - 1)
    valid = (row < layers * rows) & (pos >= starts[in_row]) & (entries % num_kv_heads == in_row % num_kv_heads)
    phys = entries // num_kv_heads // PAGE_SIZE
    keys = torch.where(valid, (in_row << _ROW_SHIFT) | phys, torch.full_like(phys, -1)).sort().values
    j = torch.arange(pages, device=device)
    first = tables[:, (j * PAGE_SIZE).clamp(max=tables.shape[1] - 1)].to(torch.int64) // PAGE_SIZE  # [B, pages]
    row_ids = torch.arange(layers * rows, device=device).view(layers, bsz, num_kv_heads, 1)
    want = (row_ids << _ROW_SHIFT) | first[None, :, None, :]
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
