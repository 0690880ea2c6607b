import pytest
import torch

from helpers import random_cache
from sglang_locks.config import LocksConfig
from sglang_locks.decode import locks_decode_reference
from sglang_locks.kernels.aggregate_scores import aggregate_scores_torch
from sglang_locks.kernels.selected_indices import selected_indices_torch, selected_indices_triton
from sglang_locks.selection import select_pages, selection_indptr
from sglang_locks.sparse_decode import dense_decode_reference, sparse_decode_reference


def _agg(seq_lens, hkv, cfg, seed=0):
    gen = torch.Generator().manual_seed(seed)
    max_pages = max(seq_lens) // 16
    scores = torch.randn(len(seq_lens), hkv * 4, max_pages, generator=gen).double()
    lens = torch.tensor(seq_lens)
    return aggregate_scores_torch(scores, lens, hkv, cfg.sink_pages, cfg.local_pages, "mass"), lens


def test_selection_contains_sink_local_and_is_top():
    cfg = LocksConfig(token_budget=160, sink_pages=2, local_pages=3)
    agg, lens = _agg([16 * 50 + 7, 16 * 30], 2, cfg)
    sel = select_pages(agg, cfg.budget_pages).view(2, 2, -1)
    for b, n in enumerate([50, 30]):
        for h in range(2):
            got = set(sel[b, h].tolist())
            assert len(got) == cfg.budget_pages
            assert {0, 1, n - 3, n - 2, n - 1} <= got
            free = [p for p in range(2, n - 3)]
            best = sorted(free, key=lambda p: -agg[b, h, p].item())[: cfg.budget_pages - 5]
            assert got - {0, 1, n - 3, n - 2, n - 1} == set(best)


@pytest.mark.parametrize("seq_lens", [[16 * 50 + 7, 16 * 3 + 2, 9, 16 * 12], [16 * 11]])
def test_indices_kernel_matches_reference_and_includes_tail(seq_lens, device):
    hkv, cfg = 3, LocksConfig(token_budget=160)
    c = random_cache(seq_lens, hkv, 64, device=device)
    max_pages = max(seq_lens) // 16
    gen = torch.Generator().manual_seed(5)
    scores = torch.randn(len(seq_lens), hkv * 2, max_pages, generator=gen).double()
    agg = aggregate_scores_torch(scores, c["seq_lens"].cpu(), hkv, 1, 1, "mass")
    sel = select_pages(agg, cfg.budget_pages)
    indptr_ref, indices_ref = selected_indices_torch(sel, c["req_to_token"].cpu(), c["req_pool_indices"].cpu(), c["seq_lens"].cpu(), hkv, cfg.budget_pages)
    indptr = selection_indptr(c["seq_lens"].cpu(), hkv, cfg.budget_pages)
    assert torch.equal(indptr, indptr_ref)
    indices = torch.full((int(indptr[-1]) + 5,), -7, dtype=torch.int32, device=device)
    selected_indices_triton(sel.to(device), c["req_to_token"], c["req_pool_indices"], c["seq_lens"], indptr.to(device), indices, hkv, cfg.budget_pages)
    assert torch.equal(indices[: int(indptr[-1])].cpu(), indices_ref)
    assert (indices[int(indptr[-1]) :] == -7).all()  # nothing written past the rows
    for row in range(len(seq_lens) * hkv):  # tail tokens are always attended
        b, h = divmod(row, hkv)
        n = int(c["seq_lens"][b])
        table = c["req_to_token"][int(c["req_pool_indices"][b])].cpu()
        tail = set((table[n // 16 * 16 : n].long() * hkv + h).tolist())
        assert tail <= set(indices_ref[indptr[row] : indptr[row + 1]].tolist())


@pytest.mark.parametrize("group", [1, 4])
def test_budget_covering_context_is_dense(group):
    seq_lens = [16 * 20 + 5, 16 * 7, 11]
    c = random_cache(seq_lens, 2, 64, dtype=torch.float32)
    q = torch.randn(3, 2 * group, 64)
    cfg = LocksConfig(token_budget=16 * 20)
    out = locks_decode_reference(q, c["k_cache"], c["v_cache"], c["summaries"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"], cfg, 0.125)
    ref = dense_decode_reference(q, c["k_cache"], c["v_cache"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"], 0.125)
    assert torch.allclose(out, ref, atol=1e-5)


def test_small_budget_differs_from_dense_but_keeps_most_mass():
    """A sanity check that selection really drops pages (a test that cannot fail proves nothing)."""
    seq_lens = [16 * 64]
    c = random_cache(seq_lens, 1, 64, dtype=torch.float32)
    q = torch.randn(1, 4, 64)
    cfg = LocksConfig(token_budget=16 * 8)
    out = locks_decode_reference(q, c["k_cache"], c["v_cache"], c["summaries"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"], cfg, 0.125)
    ref = dense_decode_reference(q, c["k_cache"], c["v_cache"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"], 0.125)
    assert not torch.allclose(out, ref, atol=1e-3)


def test_sparse_reference_on_explicit_indices():
    k = torch.randn(40, 2, 8)
    v = torch.randn(40, 2, 8)
    q = torch.randn(1, 2, 8)
    indptr = torch.tensor([0, 3, 5])
    indices = torch.tensor([0 * 2 + 0, 7 * 2 + 0, 9 * 2 + 0, 1 * 2 + 1, 39 * 2 + 1], dtype=torch.int32)
    out = sparse_decode_reference(q, k, v, indptr, indices, 2, 0.3)
    p = torch.softmax(q[0, 0] @ k[[0, 7, 9], 0].T * 0.3, -1)
    assert torch.allclose(out[0, 0], p @ v[[0, 7, 9], 0], atol=1e-6)
