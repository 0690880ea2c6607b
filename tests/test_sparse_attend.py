"""The split-page sparse attention kernel against the float32 reference (Triton interpreter on CPU, or the GPU)."""

import pytest
import torch

from helpers import random_cache
from sglang_locks.kernels.page_selection import selected_indices_torch
from sglang_locks.kernels.sparse_attend import SparseAttendBuffers, attend_launch, sparse_attend_triton
from sglang_locks.selection import selected_pages
from sglang_locks.sparse_decode import dense_decode_reference, sparse_decode_reference

SHAPES = [  # seq_lens, KV heads, group, budget pages
    ([16 * 40 + 5, 7, 16 * 29], 2, 4, 24),
    ([16 * 50 + 11], 1, 16, 40),
    ([9, 16 * 14 + 1, 16 * 20, 300], 2, 8, 8),
    ([16 * 26 + 15, 40], 2, 1, 10),
    ([16 * 33 + 2, 16 * 4], 2, 7, 12),  # 7 query heads per KV head
]


def _rows(c, hkv, budget_pages, seed):
    """Random page picks per (request, KV head) row, as FlashInfer entries, and the rows' last page lengths."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = c["seq_lens"].cpu()
    max_pages = max(1, int(seq_lens.max()) // 16)
    rows = seq_lens.numel() * hkv
    sel = torch.stack([torch.randperm(max_pages, generator=gen)[: min(budget_pages, max_pages)] for _ in range(rows)])
    indptr, indices = selected_indices_torch(sel, c["req_to_token"].cpu(), c["req_pool_indices"].cpu(), seq_lens,
                                             hkv, budget_pages)
    _, last_page_len = selected_pages(seq_lens, hkv, budget_pages)
    return indptr, indices, last_page_len


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("seq_lens, hkv, group, budget_pages", SHAPES)
@pytest.mark.parametrize("splits, pages_per_iter", [(1, 4), (4, 2), (16, 8), (8, 4)])
def test_sparse_attend_matches_reference(device, seq_lens, hkv, group, budget_pages, splits, pages_per_iter):
    c = random_cache(seq_lens, hkv, 128, device=device, seed=group + splits)
    bsz = len(seq_lens)
    q = torch.randn(bsz, hkv * group, 128, generator=torch.Generator().manual_seed(splits)).to(device, torch.bfloat16)
    indptr, indices, last = _rows(c, hkv, budget_pages, seed=splits)
    buffers = SparseAttendBuffers.in_workspace(torch.empty(1 << 20, dtype=torch.uint8, device=device), group, 128)
    args = (q, c["k_cache"], c["v_cache"], indptr.to(device), indices.to(device), last.to(device), bsz * hkv, splits,
            128**-0.5, buffers)
    out = sparse_attend_triton(*args, pages_per_iter=pages_per_iter)
    ref = sparse_decode_reference(q, c["k_cache"], c["v_cache"], indptr, indices, last, hkv, 128**-0.5)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert _rel(out, ref) < 1e-2


@pytest.mark.parametrize("dtype, head_dim", [(torch.float16, 128), (torch.bfloat16, 96), (torch.bfloat16, 64)])
def test_sparse_attend_dtypes_and_head_dims(device, dtype, head_dim):
    """fp16, and head dims other than 128 (96: not a power of two, padded in the kernel)."""
    seq_lens, hkv, group = [16 * 21 + 7, 16 * 9], 2, 4
    c = random_cache(seq_lens, hkv, head_dim, device=device, dtype=dtype, seed=head_dim)
    q = torch.randn(2, hkv * group, head_dim, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    indptr, indices, last = _rows(c, hkv, 12, seed=1)
    out = sparse_attend_triton(q, c["k_cache"], c["v_cache"], indptr.to(device), indices.to(device),
                               last.to(device), 2 * hkv, 4, head_dim**-0.5)
    ref = sparse_decode_reference(q, c["k_cache"], c["v_cache"], indptr, indices, last, hkv, head_dim**-0.5)
    assert out.dtype == dtype
    assert _rel(out, ref) < 1e-2


@pytest.mark.parametrize("splits", [1, 4])
def test_rows_without_pages_give_zeros(device, splits):
    """A row with no entries (a padded batch row) attends nothing: zeros, never NaN; the other rows are unaffected."""
    c = random_cache([16 * 6 + 2], 2, 128, device=device, seed=9)
    q = torch.randn(2, 8, 128, generator=torch.Generator().manual_seed(9)).to(device, torch.bfloat16)
    indptr, indices, last = _rows(c, 2, 8, seed=9)
    indptr = torch.cat([indptr, indptr[-1:].repeat(2)])  # request 1: two rows without entries
    last = torch.cat([last, torch.full((2,), 16, dtype=last.dtype)])
    cache = {k: c[k] for k in ("k_cache", "v_cache")}
    out = sparse_attend_triton(q, cache["k_cache"], cache["v_cache"], indptr.to(device), indices.to(device),
                               last.to(device), 4, splits, 128**-0.5)
    assert torch.equal(out[1].float().cpu(), torch.zeros(8, 128))
    ref = sparse_decode_reference(q[:1], cache["k_cache"], cache["v_cache"], indptr[:3], indices, last[:2], 2,
                                  128**-0.5)
    assert _rel(out[:1], ref) < 1e-2


def test_mixed_dtypes_are_refused():
    q = torch.zeros(1, 4, 128, dtype=torch.bfloat16)
    cache = torch.zeros(32, 1, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match="bf16 or fp16 of one dtype"):
        sparse_attend_triton(q, cache, cache, torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([16]), 1, 1, 0.1)


def test_budget_over_context_is_dense_attention(device):
    """Every page selected (budget >= context): the kernel is dense attention of each request."""
    seq_lens, hkv, group = [16 * 9 + 3, 16 * 5, 2], 2, 4
    c = random_cache(seq_lens, hkv, 128, device=device, seed=5)
    bsz = len(seq_lens)
    q = torch.randn(bsz, hkv * group, 128, generator=torch.Generator().manual_seed(5)).to(device, torch.bfloat16)
    indptr, indices, last = _rows(c, hkv, 64, seed=5)
    out = sparse_attend_triton(q, c["k_cache"], c["v_cache"], indptr.to(device), indices.to(device),
                               last.to(device), bsz * hkv, 4, 128**-0.5)
    dense = dense_decode_reference(q, c["k_cache"], c["v_cache"], c["req_to_token"], c["req_pool_indices"],
                                   c["seq_lens"], 128**-0.5)
    assert _rel(out, dense) < 1e-2


@pytest.mark.parametrize("rows, pages, sms, expected", [
    (8, 129, 132, (32, 8)),    # Llama-3.1-8B bs=1 at budget 2048: parts of 4-5 pages, loaded at once
    (2, 129, 132, (32, 8)),    # GLM-4-9B-1M bs=1
    (32, 129, 132, (16, 4)),   # Llama bs=4: parts of 8-9 pages, 4 at a time
    (64, 129, 132, (8, 4)),    # bs=8
    (8, 3, 132, (1, 8)),       # short rows: one part
    (1, 10_000, 132, (64, 4)),
])
def test_attend_launch(rows, pages, sms, expected):
    assert attend_launch(rows, pages, sms) == expected


@pytest.mark.parametrize("splits, match", [
    (3, "splits must be a power of two"),
    (0, "splits must be a power of two"),
    (8, "buffers hold 4 row parts: got 1 rows of 8"),
])
def test_bad_launch_arguments(splits, match):
    q = torch.zeros(1, 8, 128, dtype=torch.bfloat16)
    cache = torch.zeros(32, 1, 128, dtype=torch.bfloat16)
    buffers = SparseAttendBuffers.allocate(4, 8, 128, "cpu")
    with pytest.raises(ValueError, match=match):
        sparse_attend_triton(q, cache, cache, torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([16]), 1, splits,
                             0.1, buffers)


@pytest.mark.parametrize("budget", [64, 2048])  # 4 of 9-20 pages per row; every page (dense attention)
def test_locks_decode_step_with_the_triton_sparse_decode(device, budget):
    """A whole LOCKS step (score, select, attend) through LocksDecode: attention over the pages it selected
    (test_selection checks the picks), and dense attention when the budget covers the context."""
    from sglang_locks.config import LocksConfig
    from sglang_locks.decode import LocksDecode

    seq_lens, hkv, group = [16 * 9 + 3, 16 * 20, 16 * 12 + 15], 2, 4
    c = random_cache(seq_lens, hkv, 128, device=device, seed=budget)
    cfg = LocksConfig(token_budget=budget, sparse_decode="triton")
    q = torch.randn(len(seq_lens), hkv * group, 128, generator=torch.Generator().manual_seed(3)).to(device, torch.bfloat16)
    dec = LocksDecode(cfg, torch.empty(1 << 24, dtype=torch.uint8, device=device), hkv * group, hkv, 128, len(seq_lens))
    dec.plan(c["seq_lens"].cpu(), torch.bfloat16, torch.bfloat16)
    tables = (c["req_to_token"], c["req_pool_indices"], c["seq_lens"])
    out = dec.run(q, c["k_cache"], c["v_cache"], c["summaries"], *tables)
    indptr, last = selected_pages(c["seq_lens"].cpu(), hkv, cfg.budget_pages)
    picked = dec.sparse.indices[: int(indptr[-1])]
    assert _rel(out, sparse_decode_reference(q, c["k_cache"], c["v_cache"], indptr, picked, last, hkv, 128**-0.5)) < 1e-2
    if budget >= max(seq_lens):
        assert _rel(out, dense_decode_reference(q, c["k_cache"], c["v_cache"], *tables, 128**-0.5)) < 1e-2


@pytest.mark.parametrize("group", [4, 16])  # the selection merges the score partials / (GPU) reads the masses
def test_decoders_of_several_batch_sizes_share_one_selection_state(device, group):
    """The plugin's CUDA-graph decoders (one per batch size) run one after the other on one SelectionState: each
    step's page entries and output equal those of a decoder with a state of its own, the shared state is zero
    after every step, and a state too small for a decoder is refused."""
    from sglang_locks.config import LocksConfig
    from sglang_locks.decode import LocksDecode
    from sglang_locks.kernels.page_selection import SelectionState

    hkv = 2
    cfg = LocksConfig(token_budget=64, sparse_decode="triton")  # 4 pages: every row below selects
    shared = SelectionState(4 * hkv, device, group)
    workspace = torch.empty(1 << 24, dtype=torch.uint8, device=device)
    for seed, seq_lens in enumerate([[16 * 19 + 3, 16 * 11], [16 * 23 + 9], [16 * 9 + 1, 16 * 17, 16 * 13 + 4, 16 * 21]]):
        c = random_cache(seq_lens, hkv, 128, device=device, seed=seed)
        q = torch.randn(len(seq_lens), hkv * group, 128, generator=torch.Generator().manual_seed(seed))
        q = q.to(device, torch.bfloat16)
        tables = (c["req_to_token"], c["req_pool_indices"], c["seq_lens"])
        n = int(selected_pages(c["seq_lens"].cpu(), hkv, cfg.budget_pages)[0][-1])
        steps = []
        for state in (shared, None):
            dec = LocksDecode(cfg, workspace, hkv * group, hkv, 128, len(seq_lens), selection_state=state)
            dec.plan(c["seq_lens"].cpu(), torch.bfloat16, torch.bfloat16)
            out = dec.run(q, c["k_cache"], c["v_cache"], c["summaries"], *tables)
            steps.append((out.clone(), dec.sparse.indices[:n].clone()))
        assert torch.equal(steps[0][1], steps[1][1])
        assert torch.equal(steps[0][0], steps[1][0])
        assert not (shared.hist.any() or shared.arrived.any() or shared.mass.any())
    with pytest.raises(ValueError, match="selection_state holds 8 rows"):
        LocksDecode(cfg, workspace, hkv * group, hkv, 128, 5, selection_state=shared)
    with pytest.raises(ValueError, match="selection_state holds"):
        LocksDecode(cfg, workspace, hkv * 2 * group, hkv, 128, 1, selection_state=SelectionState(4 * hkv, device, group))
