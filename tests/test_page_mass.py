"""page_mass / attended_pages (the server's recall audit) against a float64 reference and against the recall
sglang_locks.evaluate defines, on awkward shapes: lengths off the 16-token grid, mixed lengths in one batch,
GQA groups 1/4/16, pages shared between requests, contexts whose pages all fit the budget."""

import pytest
import torch

from sglang_locks.config import PAGE_SIZE
from sglang_locks.evaluate import _token_mask
from sglang_locks.kernels.page_selection import selected_indices_torch
from sglang_locks.page_mass import (attended_pages, attended_share, attended_share_reference, layers_attended_pages,
                                    layers_page_mass, page_mass)


def _batch(lens, hkv, group, d=16, shared_pages=0, seed=0):
    """Keys in a shuffled paged cache, the requests' tables (request 1 starts with request 0's first
    shared_pages physical pages, as after a radix-cache hit) and one decode query per request."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // PAGE_SIZE) for n in lens]
    phys = (torch.randperm(sum(need) + 4, generator=gen) + 1).tolist()  # page 0: never mapped
    width = max(need) * PAGE_SIZE
    tables = torch.zeros(len(lens), width, dtype=torch.int32)
    pages_of = []
    for b, n_pages in enumerate(need):
        own = [phys.pop() for _ in range(n_pages)]
        if b == 1 and shared_pages:
            own[:shared_pages] = pages_of[0][:shared_pages]
        pages_of.append(own)
        for j, p in enumerate(own):
            tables[b, j * PAGE_SIZE : (j + 1) * PAGE_SIZE] = p * PAGE_SIZE + torch.arange(PAGE_SIZE)
    slots = (max(max(p) for p in pages_of) + 1) * PAGE_SIZE
    k_cache = torch.randn(slots, hkv, d, generator=gen) * 1.5
    q = torch.randn(len(lens), hkv * group, d, generator=gen)
    return q, k_cache, tables, torch.tensor(lens)


def _selection(lens, hkv, budget_pages, seed=1):
    """Random distinct sealed pages per row [B * H_kv, budget_pages] (rows that fit attend all anyway)."""
    gen = torch.Generator().manual_seed(seed)
    sel = torch.zeros(len(lens) * hkv, budget_pages, dtype=torch.int64)
    for b, n in enumerate(lens):
        for h in range(hkv):
            sealed = n // PAGE_SIZE
            if sealed > budget_pages:
                sel[b * hkv + h] = torch.randperm(sealed, generator=gen)[:budget_pages].sort().values
    return sel


def _audit(q, k_cache, tables, seq_lens, indptr, indices, **kw):
    d = q.shape[-1]
    mass = page_mass(q, k_cache, tables, seq_lens, int(seq_lens.max()), d**-0.5, **kw)
    return mass, attended_share(mass, attended_pages(tables, mass.shape[-1], indptr, indices, k_cache.shape[1]))


def _evaluate_recall(q, k_cache, tables, lens, sel, hkv, budget_pages):
    """evaluate()'s recall (per query head, then averaged over the KV head's group) of the same selection."""
    out = torch.empty(len(lens), hkv, dtype=torch.float64)
    group = q.shape[1] // hkv
    for b, n in enumerate(lens):
        keys = k_cache[tables[b, :n].long()].double()
        k_full = keys.repeat_interleave(group, 1)
        probs = torch.softmax(torch.einsum("hd,nhd->hn", q[b].double(), k_full) * q.shape[-1] ** -0.5, -1)
        mask = _token_mask(sel[b * hkv : (b + 1) * hkv], n, budget_pages, hkv, 1)[0].repeat_interleave(group, 0)
        out[b] = (probs * mask).sum(-1).view(hkv, group).mean(-1)
    return out


@pytest.mark.parametrize("group", [1, 4, 16])
def test_share_equals_reference_and_evaluate(group):
    lens, hkv, budget_pages = [37, 200, 513], 2, 5
    q, k_cache, tables, seq_lens = _batch(lens, hkv, group, shared_pages=2)
    sel = _selection(lens, hkv, budget_pages)
    indptr, indices = selected_indices_torch(sel, tables, torch.arange(len(lens)), seq_lens, hkv, budget_pages)
    mass, share = _audit(q, k_cache, tables, seq_lens, indptr, indices)
    torch.testing.assert_close(mass.sum(-1), torch.ones(len(lens), hkv))
    want = attended_share_reference(q, k_cache, tables, seq_lens, indptr, indices, q.shape[-1] ** -0.5)
    torch.testing.assert_close(share.double(), want, atol=1e-5, rtol=0)
    torch.testing.assert_close(share.double(), _evaluate_recall(q, k_cache, tables, lens, sel, hkv, budget_pages),
                               atol=1e-5, rtol=0)
    assert share[1].lt(1).all() and share[2].lt(1).all()  # rows longer than the budget lose some mass


def test_pages_within_the_budget_are_all_attended():
    lens, hkv = [1, 15, 16, 70], 4
    q, k_cache, tables, seq_lens = _batch(lens, hkv, 4)
    indptr, indices = selected_indices_torch(_selection(lens, hkv, 8), tables, torch.arange(4), seq_lens, hkv, 8)
    _, share = _audit(q, k_cache, tables, seq_lens, indptr, indices)
    torch.testing.assert_close(share, torch.ones(4, hkv))


def test_chunks_do_not_change_the_mass():
    lens, hkv = [333, 90], 2
    q, k_cache, tables, seq_lens = _batch(lens, hkv, 4, seed=3)
    indptr, indices = selected_indices_torch(_selection(lens, hkv, 4), tables, torch.arange(2), seq_lens, hkv, 4)
    whole, share = _audit(q, k_cache, tables, seq_lens, indptr, indices)
    chunked, share_chunked = _audit(q, k_cache, tables, seq_lens, indptr, indices, chunk_values=1)
    torch.testing.assert_close(chunked, whole)
    torch.testing.assert_close(share_chunked, share)


def test_only_the_rows_own_entries_count():
    """An entry of another KV head, or past the rows' entries in the buffer, attends nothing of the row; a page
    shared with another request counts for each request that attends it."""
    lens, hkv = [64, 64], 2
    q, k_cache, tables, seq_lens = _batch(lens, hkv, 2, shared_pages=4)
    first = tables[:, ::PAGE_SIZE].long()  # [2, 4] first slots of the logical pages
    # row 0 (req 0, head 0) holds page 0 of head 1 and its own page 1; row 1 nothing; rows 2, 3 their page 0.
    entries = [first[0, 0] * hkv + 1, first[0, 1] * hkv, first[1, 0] * hkv, first[1, 0] * hkv + 1]
    indptr = torch.tensor([0, 2, 2, 3, 4], dtype=torch.int32)
    indices = torch.tensor(entries + [first[0, 2] * hkv] * 3, dtype=torch.int32)  # trailing garbage
    attended = attended_pages(tables, 4, indptr, indices, hkv)
    want = torch.zeros(2, hkv, 4, dtype=torch.bool)
    want[0, 0, 1] = want[1, 0, 0] = want[1, 1, 0] = True
    assert torch.equal(attended, want)


def test_layers_in_one_pass_equal_each_layer_alone():
    """The audit's one pass over its layers: each layer's own cache, scale and entries (the buffer of each holding
    garbage past its rows' entries, which must not leak into the next layer's rows), as page_mass and
    attended_pages give layer by layer."""
    lens, hkv, group, budget_pages = [513, 200, 37], 2, 4, 5  # request 0's rows select: the garbage is theirs
    layers = [_batch(lens, hkv, group, shared_pages=2, seed=s) for s in (4, 5, 6)]
    tables, seq_lens = layers[0][2], layers[0][3]  # one batch of requests: the first layout's tables for all
    scales = [1.0, 0.37, 2.5]
    slot_width = max(k.shape[0] for _, k, _, _ in layers)
    caches = [torch.cat([k, torch.randn(slot_width - k.shape[0], *k.shape[1:])]) for _, k, _, _ in layers]
    q = torch.stack([q for q, _, _, _ in layers])
    sels = [_selection(lens, hkv, budget_pages, seed=s) for s in (7, 8, 9)]
    width = len(lens) * hkv * (budget_pages + 1) + 7  # room past the rows' entries
    indices = torch.full((3, width), 0, dtype=torch.int32)
    for l, sel in enumerate(sels):
        indptr, idx = selected_indices_torch(sel, tables, torch.arange(len(lens)), seq_lens, hkv, budget_pages)
        indices[l, : idx.numel()] = idx
        end = int(indptr[-1])
        indices[l, end:] = idx.repeat(2)[: width - end]  # garbage: real entries, of other rows
    d = q.shape[-1]
    mass = layers_page_mass(q, caches, scales, tables, seq_lens, int(seq_lens.max()), d**-0.5, chunk_values=4096)
    attended = layers_attended_pages(tables, mass.shape[-1], indptr, indices, hkv)
    for l in range(3):
        want = page_mass(q[l], caches[l], tables, seq_lens, int(seq_lens.max()), d**-0.5, scales[l])
        torch.testing.assert_close(mass[l], want)
        assert torch.equal(attended[l], attended_pages(tables, mass.shape[-1], indptr, indices[l], hkv))
    assert not torch.equal(attended[0], attended[1])  # the layers' selections differ
