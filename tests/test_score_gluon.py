"""The Gluon score kernel (score_pages_gluon) against the float64 reference and the Triton kernel (GPU), and
which kernel score_pages_full picks (CPU)."""

import pytest
import torch

from helpers import assert_chunk_partials, assert_head_mass, random_cache
from sglang_locks.kernels.score_pages import score_pages_torch, score_pages_triton
from sglang_locks.kernels.score_pages_gluon import STEP_PAIRS, gluon_applies, score_pages_gluon
from sglang_locks.scoring import score_pages_full

CASES = [
    # seq_lens (awkward, mixed, empty and shorter than a page), KV heads, group (1-16)
    ([16 * 37 + 5, 47, 3, 16 * 40], 2, 4),
    ([16 * 301 + 9], 8, 4),
    ([16 * 33], 1, 16),
    ([0, 16 * 65 + 15, 200], 4, 1),
    ([16 * 9 + 7, 16 * 70, 0], 2, 8),
    ([16 * 130 + 1, 16], 4, 2),
]


@pytest.mark.gpu
@pytest.mark.parametrize("seq_lens, hkv, group", CASES)
@pytest.mark.parametrize("chunk_pages", [None, 24, 200])
def test_gluon_scores_match_float64_reference(seq_lens, hkv, group, chunk_pages, device):
    c = random_cache(seq_lens, hkv, 128, device=device, seed=len(seq_lens) * 5 + group)
    q = torch.randn(len(seq_lens), hkv * group, 128, device=device).bfloat16()
    max_pages = max(seq_lens) // 16 + 3  # wider than needed, like a static graph buffer
    args = (c["summaries"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"], max_pages, 128**-0.5)
    mass = torch.full((q.shape[0] * q.shape[1] + 3, 4), 0.5, dtype=torch.float64, device=device)
    scores, part_max, part_sum = score_pages_gluon(q, *args, chunk_pages=chunk_pages, mass=mass)
    ref = score_pages_torch(q.double(), *args)
    finite = torch.isfinite(ref)  # the sealed pages; the kernel leaves the rest unwritten
    assert torch.isfinite(scores[finite]).all()
    assert torch.allclose(scores[finite].double(), ref[finite], atol=1e-3, rtol=1e-3)
    triton_scores = score_pages_triton(q, *args)[0]
    # each kernel is within 1e-3 of float64, so they are within twice that of each other (at 1e-3 a fresh q failed:
    # 5.6656 vs 5.6657)
    assert torch.allclose(scores[finite], triton_scores[finite], atol=2e-3, rtol=2e-3)
    # chunk partials: a row's sealed pages split over its programs in whole steps of 2 * STEP_PAIRS pages
    assert_chunk_partials(part_max, part_sum, ref, c["seq_lens"], 2 * STEP_PAIRS, 1e-3)
    assert_head_mass(mass, 0.5, part_max, part_sum, ref, 1e-2)


@pytest.mark.gpu
def test_score_pages_full_picks_gluon_and_writes_into_out(device):
    c = random_cache([16 * 50 + 3, 16 * 7], 2, 128, device=device, seed=11)
    q = torch.randn(2, 8, 128, device=device).bfloat16()
    args = (c["summaries"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"], 60, 128**-0.5)
    want = score_pages_gluon(q, *args, chunk_pages=16)
    out = (torch.full_like(want[0], 7.0), torch.empty(2, 8, 6, device=device), torch.empty(2, 8, 6, device=device), 2)
    got = score_pages_full(q, *args, chunk_pages=16, out=out)
    assert got[0] is out[0]
    sealed = _sealed(c["seq_lens"], 60).expand_as(want[0])
    assert torch.equal(got[0][sealed], want[0][sealed])
    assert (got[0][~sealed] == 7.0).all()
    assert torch.equal(out[1][..., 2:], want[1]) and torch.equal(out[2][..., 2:], want[2])


def _sealed(seq_lens, max_pages):
    """[B, 1, max_pages]: the pages a launch writes (its sealed pages)."""
    return (torch.arange(max_pages, device=seq_lens.device) < (seq_lens.long() // 16)[:, None])[:, None, :]


def test_gluon_applies_only_where_it_can(device):
    c = random_cache([64], 2, 128, device=device)
    s = c["summaries"]
    q = torch.randn(1, 8, 128, device=device)
    assert gluon_applies(q, s) == (device == "cuda")
    assert not gluon_applies(torch.randn(1, 6, 128, device=device), s)  # group 3
    assert not gluon_applies(torch.randn(1, 64, 128, device=device), s)  # group 32
    for precision, rank in (("fp32", 8), ("bf16", 8), ("int8-int4-int8", 4)):
        other = random_cache([64], 2, 128, precision, rank=rank, device=device)["summaries"]
        assert not gluon_applies(q, other)


def test_score_pages_full_falls_back_to_triton(device):
    """Off the GPU, for other summaries, and when Triton launch options are given, score_pages_full is
    score_pages_triton."""
    c = random_cache([16 * 20 + 3, 40], 2, 128, "fp32", device=device, seed=2)
    q = torch.randn(2, 8, 128, device=device)
    args = (c["summaries"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"], 24, 128**-0.5)
    for options in ({}, {"kernel": "triton"}, {"block_pages": 16}):
        got = score_pages_full(q, *args, chunk_pages=16, **options)
        want = score_pages_triton(q, *args, chunk_pages=16)
        sealed = _sealed(c["seq_lens"], 24).expand_as(want[0])
        assert torch.equal(got[0][sealed], want[0][sealed])
    with pytest.raises(ValueError, match="kernel must be"):
        score_pages_full(q, *args, kernel="cuda")
    with pytest.raises(ValueError, match="int8-int4-int8 summaries of rank 8"):
        score_pages_gluon(q, *args)


@pytest.mark.gpu
def test_gluon_scores_with_int64_lengths(device):
    """SGLang's seq_lens and req_pool_indices are int64 (the stage index must stay int32)."""
    c = random_cache([16 * 90 + 5, 33], 8, 128, device=device, seed=4)
    q = torch.randn(2, 32, 128, device=device).bfloat16()
    table = (c["summaries"], c["req_to_token"])
    want = score_pages_gluon(q, *table, c["req_pool_indices"], c["seq_lens"], 96, 128**-0.5)
    got = score_pages_gluon(q, *table, c["req_pool_indices"].long(), c["seq_lens"].long(), 96, 128**-0.5)
    sealed = _sealed(c["seq_lens"], 96).expand_as(want[0])
    assert torch.equal(got[0][sealed], want[0][sealed])
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])


def test_gluon_applies_to_head_dim_128_only(device):
    s = random_cache([64], 2, 64, device=device)["summaries"]
    assert not gluon_applies(torch.randn(1, 8, 64, device=device), s)
