"""select_pages: top pages per (request, KV head) within the token budget."""

from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np
import torch

from .config import PAGE_SIZE


def select_pages(agg: torch.Tensor, budget_pages: int) -> torch.Tensor:
    """agg [B, H_kv, P] (forced pages +inf, padding -inf) -> logical page ids [B * H_kv, k].

    k = min(budget_pages, P). Rows whose sealed pages all fit are attended
    densely by selected_indices_triton, which then ignores their entries here.
    """
    rows = agg.shape[0] * agg.shape[1]
    k = min(budget_pages, agg.shape[2])
    if k == 0:
        return torch.zeros(rows, 0, dtype=torch.int64, device=agg.device)
    return torch.topk(agg.view(rows, -1), k, dim=1, sorted=False).indices


def selected_lengths(seq_lens: torch.Tensor, num_kv_heads: int, budget_pages: int) -> torch.Tensor:
    """Tokens attended by each (request, KV head) row: a function of seq_len alone."""
    n_sealed = seq_lens.long() // PAGE_SIZE
    lens = torch.clamp(n_sealed, max=budget_pages) * PAGE_SIZE + seq_lens.long() - n_sealed * PAGE_SIZE
    return lens.repeat_interleave(num_kv_heads)


def pages_per_request(seq_lens: Sequence[int], budget_pages: int) -> Tuple[int, ...]:
    """Pages each request's rows attend (its selected sealed pages, then its tail page if any): what
    FlashInfer's plan depends on, in plain Python for the per-step check (SparseDecodeWrapper.plan)."""
    return tuple(min(n // PAGE_SIZE, budget_pages) + (n % PAGE_SIZE > 0) for n in seq_lens)


def selected_pages(seq_lens: torch.Tensor, num_kv_heads: int, budget_pages: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's page layout of the rows (request, KV head): page indptr [rows + 1] (the selected
    sealed pages, then the tail page if any) and the last page's length [rows] (the tail's, or 16
    when the last page is a sealed one), int32 on the CPU. A function of seq_len alone; computed
    once per decode step on the host, in numpy (a dozen small torch ops cost ~0.1 ms there)."""
    n = seq_lens.cpu().numpy().astype(np.int64)
    n_sealed, tail = np.divmod(n, PAGE_SIZE)
    pages = np.repeat(np.minimum(n_sealed, budget_pages) + (tail > 0), num_kv_heads)
    indptr = np.zeros(pages.size + 1, dtype=np.int32)
    np.cumsum(pages, out=indptr[1:])
    last = np.repeat(np.where(tail > 0, tail, PAGE_SIZE), num_kv_heads).astype(np.int32)
    return torch.from_numpy(indptr), torch.from_numpy(last)
