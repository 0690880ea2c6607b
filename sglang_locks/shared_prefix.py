"""The pages a decode batch's requests share: radix-cache hits map requests to the same physical pages.

``shared_runs`` finds them once per decode step on the device, from SGLang's
``req_to_token`` (no host sync, static shapes: CUDA-graph safe). Requests whose
first sealed page is the same physical page form a group; its leader is the
group's first row in the batch; the group's shared run is the leading pages
every member's table holds identically, rounded down to whole chunks of
pages, so that a scorer can score them once for all members and each member's
own pages on their own. A request alone in its group shares nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch

from .config import PAGE_SIZE
from .kernels.score_segments import Segments


@dataclass(frozen=True)
class SharedRuns:
    """Per request of the batch [B], int32 on the batch's device: ``leader`` (the row whose page table the
    group's shared run is read from; itself when alone), ``shared_pages`` (the group's shared run: the first
    shared_pages sealed pages of every member are the same physical pages; 0 when alone) and ``members`` (the
    group's size)."""

    leader: torch.Tensor
    shared_pages: torch.Tensor
    members: torch.Tensor


def shared_runs(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, max_pages: int,
                chunk_pages: int = 1) -> SharedRuns:
    """max_pages: the widest table read (>= every request's sealed pages; static under CUDA graphs);
    chunk_pages: the shared runs' granularity (>= 1)."""
    if chunk_pages < 1 or max_pages < 1:
        raise ValueError(f"chunk_pages and max_pages must be >= 1, got {chunk_pages} and {max_pages}")
    device = req_to_token.device
    bsz = req_pool_indices.shape[0]
    n_sealed = (seq_lens.to(torch.int64) // PAGE_SIZE).clamp(max=max_pages)
    j = torch.arange(max_pages, device=device)
    rows = req_to_token[req_pool_indices.to(torch.int64)]
    pages = rows[:, (j * PAGE_SIZE).clamp(max=rows.shape[1] - 1)].to(torch.int64) // PAGE_SIZE
    live = j[None, :] < n_sealed[:, None]
    pages = torch.where(live, pages, torch.full_like(pages, -1))
    b = torch.arange(bsz, device=device)
    # A row without sealed pages keys a group of its own (-1 - b matches no other row).
    first = torch.where(n_sealed > 0, pages[:, 0], -1 - b)
    same = first[:, None] == first[None, :]
    leader = torch.where(same, b[None, :], bsz).amin(1)
    members = same.sum(1)
    common = (pages == pages[leader]) & live & live[leader]
    common = common.to(torch.int32).cumprod(1).sum(1)
    run = torch.full((bsz,), max_pages, dtype=torch.int64, device=device)
    run = run.scatter_reduce(0, leader, common.to(torch.int64), reduce="amin")[leader]
    run = torch.where(members > 1, run // chunk_pages * chunk_pages, torch.zeros_like(run))
    return SharedRuns(leader.to(torch.int32), run.to(torch.int32), members.to(torch.int32))


def score_segments_of(runs: SharedRuns, seq_lens: torch.Tensor, max_pages: int) -> Tuple[Segments, Segments]:
    """(shared, own) segments of a batch for score_segments_triton: each group's shared run, read from its
    leader's table, for all its members (slot = the leader; other slots empty), and each request's pages
    after its group's shared run, for itself (slot = the request)."""
    bsz = seq_lens.shape[0]
    b = torch.arange(bsz, device=seq_lens.device, dtype=torch.int32)
    n_sealed = (seq_lens.to(torch.int64) // PAGE_SIZE).clamp(max=max_pages).to(torch.int32)
    leads = (runs.leader == b) & (runs.members > 1)
    # Members sorted by group, each group's leader (its smallest row) first.
    order = torch.argsort(runs.leader.to(torch.int64) * bsz + b, stable=True).to(torch.int32)
    position = torch.empty_like(order).scatter_(0, order.long(), b)
    zero = torch.zeros_like(b)
    shared = Segments(table=b, start=zero, end=torch.where(leads, runs.shared_pages, zero), first=position,
                      count=torch.where(leads, runs.members, zero), members=order)
    own = Segments(table=b, start=runs.shared_pages, end=n_sealed, first=b, count=torch.ones_like(b), members=b)
    return shared, own


def shared_runs_reference(tables, chunk_pages: int = 1) -> SharedRuns:
    """shared_runs in plain Python over each request's list of sealed physical pages (CPU tensors)."""
    firsts = [t[0] if t else ("alone", i) for i, t in enumerate(tables)]
    leader, shared, members = [], [], []
    for i, t in enumerate(tables):
        group = [k for k, f in enumerate(firsts) if f == firsts[i]]
        run = 0
        if len(group) > 1:
            run = min(len(tables[k]) for k in group)
            while any(tables[k][:run] != tables[group[0]][:run] for k in group):
                run -= 1
            run = run // chunk_pages * chunk_pages
        leader.append(group[0])
        shared.append(run)
        members.append(len(group))
    as_t = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    return SharedRuns(as_t(leader), as_t(shared), as_t(members))
