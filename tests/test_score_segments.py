"""Scores with shared runs scored once for every member (score_pages_shared) against the float64 reference of
scoring each request's pages on its own (Triton interpreter on CPU)."""

import pytest
import torch

from helpers import page_keys, shared_prefix_batch, summaries_of
from sglang_locks.kernels.score_pages import score_pages_torch
from sglang_locks.kernels.score_segments import score_segments_triton
from sglang_locks.scoring import score_pages_shared
from sglang_locks.shared_prefix import score_segments_of, shared_runs

POOL = 300

CASES = [
    # KV heads, query heads per KV head, batch (groups of (members, shared tokens), requests alone, own pages)
    (2, 4, dict(groups=[(5, 16 * 21 + 5)], alone=1, own_pages=3)),
    (1, 16, dict(groups=[(3, 16 * 9), (2, 16 * 5 + 9)], alone=2, own_pages=2)),
    (2, 7, dict(groups=[(4, 16 * 12 + 3)], alone=1, own_pages=2, diverge=True)),   # G not a power of two
    (1, 4, dict(groups=[(18, 16 * 6)], alone=0, own_pages=1)),                      # two blocks of 16 members
]


def score_tolerance(precision, device):
    # As score_pages_triton's test: float32 summaries meet a TF32 tensor-core dot on the GPU (the interpreter's is
    # float32); int8/int4 operands are exact there.
    return 1e-3 if precision == "int8-int4-int8" or device == "cpu" else 2e-2


def shared_cache(seed, hkv, precision, batch, device="cpu"):
    args, sealed = shared_prefix_batch(seed, pool_pages=POOL, device=device, **batch)
    gen = torch.Generator().manual_seed(seed)
    return args, sealed, summaries_of(page_keys(POOL, hkv, 128, gen), 8, precision, device)


@pytest.mark.parametrize("hkv, group, batch", CASES)
@pytest.mark.parametrize("precision", ["int8-int4-int8", "fp32"])
def test_shared_runs_scored_once_give_each_requests_scores(hkv, group, batch, precision, device):
    (req_to_token, rpi, seq_lens), sealed, summaries = shared_cache(len(batch["groups"]) + group, hkv, precision, batch,
                                                                    device)
    max_pages = max(len(t) for t in sealed) + 3
    q = torch.randn(len(sealed), hkv * group, 128, generator=torch.Generator().manual_seed(group)).bfloat16().to(device)
    runs = shared_runs(req_to_token, rpi, seq_lens, max_pages)
    assert int((runs.shared_pages > 0).sum()) >= 2  # the case shares pages
    args = (summaries, req_to_token, rpi, seq_lens, max_pages, 128**-0.5)
    scores, part_max, part_sum = score_pages_shared(q, *args, runs, chunk_pages=16)
    ref = score_pages_torch(q.double(), *args)
    sealed_pages = torch.isfinite(ref)
    tol = score_tolerance(precision, device)
    assert torch.allclose(scores[sealed_pages].double(), ref[sealed_pages], atol=tol, rtol=tol)
    # The partials of both launches make each query head's mass over its sealed pages.
    lse = torch.logsumexp(part_max.double() + part_sum.double().log(), -1)
    want = torch.logsumexp(ref, -1)
    has_pages = torch.isfinite(want)
    assert torch.equal(torch.isfinite(lse), has_pages)
    assert torch.allclose(lse[has_pages], want[has_pages], atol=tol, rtol=tol)


def test_a_shared_run_is_read_once_for_all_its_members(device):
    """The shared launch reads the group's pages from its leader's table alone: another member's table, emptied
    past its own pages, changes nothing of its scores."""
    hkv, group, batch = CASES[0]
    (req_to_token, rpi, seq_lens), sealed, summaries = shared_cache(1, hkv, "fp32", batch, device)
    max_pages = max(len(t) for t in sealed) + 1
    q = torch.randn(len(sealed), hkv * group, 128).to(device)
    runs = shared_runs(req_to_token, rpi, seq_lens, max_pages)
    shared, _ = score_segments_of(runs, seq_lens, max_pages)
    member = next(b for b in range(len(sealed)) if runs.leader[b] != b and runs.shared_pages[b] > 0)
    n = int(runs.shared_pages[member])
    rows = (len(sealed), hkv * group)
    out = (torch.full((*rows, max_pages), float("nan"), device=device),
           torch.full((*rows, 4), float("-inf"), device=device), torch.zeros(*rows, 4, device=device))
    blanked = req_to_token.clone()
    blanked[int(rpi[member]), : n * 16] = 0  # page 0: a summary of zeros, unlike any real page's
    for table in (req_to_token, blanked):
        score_segments_triton(q, summaries, table, rpi, shared, max_pages, 128**-0.5, out, chunk_pages=64)
        if table is req_to_token:
            first = out[0][member, :, :n].clone()
    assert torch.equal(out[0][member, :, :n], first)
    ref = score_pages_torch(q.double(), summaries, req_to_token, rpi, seq_lens, max_pages, 128**-0.5)
    tol = score_tolerance("fp32", device)
    assert torch.allclose(first.double(), ref[member, :, :n], atol=tol, rtol=tol)


def test_bad_tiles_and_partials_are_refused():
    hkv, group, batch = CASES[0]
    (req_to_token, rpi, seq_lens), sealed, summaries = shared_cache(0, hkv, "fp32", batch)
    runs = shared_runs(req_to_token, rpi, seq_lens, 40)
    shared, _ = score_segments_of(runs, seq_lens, 40)
    q = torch.randn(len(sealed), hkv * group, 128)
    out = (torch.empty(len(sealed), hkv * group, 40), torch.empty(len(sealed), hkv * group, 1),
           torch.empty(len(sealed), hkv * group, 1))
    with pytest.raises(ValueError, match="tile_rows must be a power of two >= 16"):
        score_segments_triton(q, summaries, req_to_token, rpi, shared, 40, 1.0, out, tile_rows=8)
    with pytest.raises(ValueError, match=r"chunks \[0, 3\) exceed the partials' 1"):
        score_segments_triton(q, summaries, req_to_token, rpi, shared, 40, 1.0, out, chunk_pages=16)


@pytest.mark.parametrize("budget", [64, 4096])  # 4 pages of up to 30 a row; every page (dense attention)
def test_locks_step_with_shared_runs_equals_the_step_without(device, budget):
    """A whole LOCKS step (score, select, attend) over a shared-prefix batch, with the shared runs scored once:
    the same pages selected and the same output as scoring each request's pages on its own."""
    from sglang_locks.config import LocksConfig
    from sglang_locks.decode import LocksDecode

    hkv, group = 2, 4
    batch = dict(groups=[(4, 16 * 22 + 7)], alone=1, own_pages=6)
    tables, sealed, summaries = shared_cache(5, hkv, "int8-int4-int8", batch, device)
    gen = torch.Generator().manual_seed(9)
    k_cache, v_cache = (torch.randn(POOL * 16, hkv, 128, generator=gen).to(device, torch.bfloat16) for _ in range(2))
    q = torch.randn(len(sealed), hkv * group, 128, generator=gen).to(device, torch.bfloat16)
    cfg = LocksConfig(token_budget=budget, sparse_decode="triton")
    steps = []
    for share in (False, True):
        dec = LocksDecode(cfg, torch.empty(1 << 24, dtype=torch.uint8, device=device), hkv * group, hkv, 128,
                          len(sealed))
        dec.plan(tables[2].cpu(), torch.bfloat16, torch.bfloat16)
        dec.share_runs(shared_runs(*tables, dec.max_pages) if share else None)
        out = dec.run(q, k_cache, v_cache, summaries, *tables)
        n = int(dec.sparse.indptr[len(sealed) * hkv])
        steps.append((out.float(), dec.sparse.indices[:n].clone()))
    assert torch.equal(steps[0][1], steps[1][1])
    assert torch.allclose(steps[0][0], steps[1][0], atol=1e-2, rtol=1e-2)

