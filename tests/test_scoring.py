"""Scoring and aggregation kernels against float64 torch references (Triton interpreter on CPU)."""

import pytest
import torch

from helpers import assert_chunk_partials, random_cache
from sglang_locks.config import LocksConfig
from sglang_locks.kernels.aggregate_scores import (
    aggregate_scores_torch,
    aggregate_scores_triton,
    key_offset_torch,
)
from sglang_locks.kernels._triton import interpreted
from sglang_locks.kernels.aggregate_scores import KEY_SCALE
from sglang_locks.kernels.score_pages import BLOCK_PAGES, pipeline_stages, score_pages_torch, score_pages_triton
from sglang_locks.kernels.page_selection import SelectionState, select_pages_by_key_torch
from sglang_locks.scoring import candidate_buffer, locks_aggregate_torch, locks_scores_triton, score_pages
from sglang_locks.summaries import PageSummaries

CASES = [
    # seq_lens (awkward, mixed, some shorter than a page), KV heads, group
    ([16 * 37 + 5, 47, 3, 16 * 40], 2, 4),
    ([16 * 33], 1, 16),
    ([200, 16 * 65 + 15], 4, 1),
    ([16 * 9 + 7, 16 * 70, 0], 2, 8),
    ([16 * 21 + 9, 16 * 3], 2, 7),  # Qwen2.5-7B's 28 query heads on 4 KV heads: not a power of two
]


@pytest.mark.parametrize("seq_lens, hkv, group", CASES)
@pytest.mark.parametrize("precision", ["int8-int4-int8", "bf16", "fp32"])
# The interpreter converts with float32 casts (int8 dots stay integer).
@pytest.mark.parametrize("conversion", ["ptx", "int8"])
def test_score_kernel_matches_float64_reference(seq_lens, hkv, group, precision, conversion, device, rank=8):
    c = random_cache(seq_lens, hkv, 128, precision, rank=rank, device=device, seed=len(seq_lens) * 7 + group)
    q = torch.randn(len(seq_lens), hkv * group, 128, device=device).bfloat16()
    max_pages = max(seq_lens) // 16 + 3  # wider than needed, like a static graph buffer
    args = (c["summaries"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"], max_pages, 128**-0.5)
    chunk = 32  # pages per program: several chunks per row, the last one partly past max_pages
    scores, part_max, part_sum = score_pages_triton(q, *args, chunk_pages=chunk, int_conversion=conversion)
    ref = score_pages_torch(q.double(), *args)
    finite = torch.isfinite(ref)  # the sealed pages; the kernel leaves the rest unwritten
    assert torch.isfinite(scores[finite]).all()
    # bf16 summaries meet a bf16 tensor-core dot on the GPU; int8/int4 operands are exact there.
    tol = 2e-2 if precision != "int8-int4-int8" else 1e-3
    assert torch.allclose(scores[finite].double(), ref[finite], atol=tol, rtol=tol)
    # Chunk partials: max and sum of exp of each chunk's scores; a row's sealed pages are spread
    # over all n_chunks of its programs.
    assert part_max.shape[-1] == -(-max_pages // chunk)
    assert_chunk_partials(part_max, part_sum, ref, c["seq_lens"], BLOCK_PAGES, tol)


@pytest.mark.parametrize("rank", [3, 5, 12, 16])  # basis rows padded to 8 (two pages per dot) or 16 (one)
@pytest.mark.parametrize("precision", ["int8-int4-int8", "fp32"])
@pytest.mark.parametrize("conversion", ["ptx", "int8"])
def test_score_kernel_other_ranks(rank, precision, conversion, device):
    test_score_kernel_matches_float64_reference(*CASES[0], precision, conversion, device, rank=rank)


@pytest.mark.parametrize("mode", ["mass", "max", "logsumexp"])
@pytest.mark.parametrize("seq_lens, hkv, group", CASES)
def test_aggregate_kernel_matches_reference(mode, seq_lens, hkv, group, device):
    c = random_cache(seq_lens, hkv, 128, device=device, seed=3)
    q = torch.randn(len(seq_lens), hkv * group, 128, device=device)
    max_pages = max(seq_lens) // 16 + 1
    args = (c["summaries"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"], max_pages, 128**-0.5)
    scores, part_max, part_sum = score_pages_triton(q, *args, chunk_pages=48)
    got = aggregate_scores_triton(scores, part_max, part_sum, c["seq_lens"], hkv, 2, 1, mode)
    past_sealed = torch.arange(max_pages, device=device) >= (c["seq_lens"].long() // 16)[:, None, None]
    ref = aggregate_scores_torch(scores.double().masked_fill(past_sealed, float("-inf")), c["seq_lens"], hkv, 2, 1, mode)
    assert torch.equal(got == float("inf"), ref == float("inf"))
    assert torch.equal(got == float("-inf"), ref == float("-inf"))
    fin = torch.isfinite(ref)
    assert torch.allclose(got[fin].double(), ref[fin], atol=1e-4, rtol=1e-4)
    # The selection keys' offset bounds every free page's agg: agg - offset is a share of the group's mass.
    offset = key_offset_torch(part_max.cpu(), part_sum.cpu(), hkv, mode)
    flat = got.view(len(seq_lens) * hkv, -1).cpu()
    free = torch.isfinite(flat)
    assert (flat <= offset[:, None] + 1e-4)[free].all()


def test_forced_pages_and_padding():
    scores = torch.randn(2, 4, 10).double()
    seq_lens = torch.tensor([16 * 10 + 3, 16 * 5])
    scores[1, :, 5:] = float("-inf")
    agg = aggregate_scores_torch(scores, seq_lens, 2, 2, 1, "mass")
    assert (agg[0, :, [0, 1, 9]] == float("inf")).all()  # sink 0, 1; local 9
    assert torch.isfinite(agg[0, :, 2:9]).all()
    assert (agg[1, :, [0, 1, 4]] == float("inf")).all() and (agg[1, :, 5:] == float("-inf")).all()


def test_full_rank_scores_are_the_exact_page_log_mass(device):
    """rank 16 = page size: the summary is lossless and the score is log sum_i exp(q.k_i * scale)."""
    seq_lens = [16 * 21 + 9, 16 * 4]
    c = random_cache(seq_lens, 2, 128, precision="fp32", rank=16, device=device, dtype=torch.float32)
    q = torch.randn(2, 8, 128, device=device, dtype=torch.float64)
    max_pages = 21
    s = score_pages_torch(q, c["summaries"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"], max_pages, 0.1)
    for b in range(2):
        n_sealed = int(c["seq_lens"][b]) // 16
        slots = c["req_to_token"][int(c["req_pool_indices"][b]), : n_sealed * 16].long()
        k = c["k_cache"][slots].double().view(n_sealed, 16, 2, 128)
        exact = torch.logsumexp(torch.einsum("hgd,pihd->hgpi", q[b].view(2, 4, 128), k) * 0.1, -1).reshape(8, n_sealed)
        assert torch.allclose(s[b, :, :n_sealed], exact, atol=1e-4)
    # The kernel too (float32 dots in the interpreter; fp16 on tensor cores on the GPU).
    kernel, _, _ = score_pages_triton(q.float(), c["summaries"], c["req_to_token"], c["req_pool_indices"],
                                      c["seq_lens"], max_pages, 0.1)
    finite = torch.isfinite(s)
    tol = 1e-4 if device == "cpu" else 2e-2
    assert torch.allclose(kernel[finite].double(), s[finite], atol=tol, rtol=tol)


def test_a_key_far_above_its_page_centroid_still_ranks_its_page_first(device):
    """The kernel's sum of exponentials needs no running max (centred coefficients) and clamps
    per-key terms at 2^120: a key 400 log2 units above its centroid logit stays finite and on top."""
    seq_lens = [16 * 12]
    c = random_cache(seq_lens, 1, 128, device=device, seed=3)
    q = torch.randn(1, 4, 128, device=device).bfloat16().float()
    keys = c["k_cache"].float().view(-1, 16, 1, 128)[1:].clone()  # every page but page 0
    slot = int(c["req_to_token"][int(c["req_pool_indices"][0]), 16 * 7 + 5])
    keys.view(-1, 1, 128)[slot - 16, 0] = q[0, 0] * 400 / (q[0, 0].norm() ** 2 * 0.1 * 1.4426950408889634)
    c["summaries"].write(torch.arange(1, keys.shape[0] + 1, device=device), keys)
    args = (c["summaries"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"], 12, 0.1)
    scores, _, _ = score_pages_triton(q.bfloat16(), *args)
    assert torch.isfinite(scores).all()
    assert int(scores[0, 0].argmax()) == 7
    ref = score_pages_torch(q.double(), *args)
    others = torch.arange(12) != 7
    assert torch.allclose(scores[0, :, others].double(), ref[0, :, others], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("precision, rank, shared_kib, stages", [
    ("int8-int4-int8", 8, 227, 3),   # the default: 12 KiB per block of 16 pages
    ("int8-int4-int8", 8, 99, 3),
    ("fp32", 8, 227, 3),             # 80 KiB per block
    ("fp32", 16, 227, 2),            # 152 KiB: three stages ran out of shared memory on the H200
    ("fp32", 8, 99, 1),
])
def test_pipeline_stages_fit_shared_memory(precision, rank, shared_kib, stages):
    s = PageSummaries.allocate(1, 1, 128, rank, precision)
    rank_p = max(8, 1 << (rank - 1).bit_length())
    assert pipeline_stages(s, 16, rank_p, 3, shared_kib * 1024) == stages


def test_score_pages_rejects_bad_heads(device):
    c = random_cache([64], 2, 128, device=device)
    q = torch.randn(1, 3, 128, device=device)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        score_pages(q, c["summaries"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"], 4, 0.1, LocksConfig())


def _lse_of_partials(part_max, part_sum):
    """Each head's log total mass from its (max, sum) chunk partials, whose sums may be negative (the candidate
    launch's: each candidate's mass less its estimate), as the selection merges them."""
    m = part_max.double()
    top = m.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    return top.squeeze(-1) + (part_sum.double() * (m - top).exp()).sum(-1).log()


@pytest.mark.parametrize("seq_lens, hkv, group", CASES)
@pytest.mark.parametrize("precision", ["int8-int4-int8", "fp32"])
@pytest.mark.parametrize("ranks", [0, 1, 2])
def test_estimate_launch_matches_reference(seq_lens, hkv, group, precision, ranks, device):
    c = random_cache(seq_lens, hkv, 128, precision, device=device, seed=group)
    q = torch.randn(len(seq_lens), hkv * group, 128, device=device).bfloat16()
    max_pages = max(seq_lens) // 16 + 3
    args = (c["summaries"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"], max_pages, 128**-0.5)
    scores, part_max, part_sum = score_pages_triton(q, *args, terms="estimate", estimate_rank=ranks, chunk_pages=64)
    ref = score_pages_torch(q.double(), *args, terms="estimate", estimate_rank=ranks)
    finite = torch.isfinite(ref)
    tol = 2e-2 if precision != "int8-int4-int8" else 1e-3
    assert torch.allclose(scores[finite].double(), ref[finite], atol=tol, rtol=tol)
    full = score_pages_torch(q.double(), *args)
    if ranks == 0:  # Jensen: a page's centroid estimate never exceeds its full score (centred coefficients)
        assert (ref[finite] <= full[finite] + 1e-9).all()
    else:
        assert not torch.allclose(ref[finite], full[finite], atol=1e-3)  # fewer ranks: another score
    lse, lse_ref = _lse_of_partials(part_max, part_sum), torch.logsumexp(ref, -1)
    assert torch.equal(torch.isfinite(lse), torch.isfinite(lse_ref))
    fin = torch.isfinite(lse_ref)
    assert torch.allclose(lse[fin], lse_ref[fin], atol=tol, rtol=tol)


@pytest.mark.parametrize("seq_lens, hkv, group", CASES)
@pytest.mark.parametrize("ranks", [0, 2])
def test_prefilter_scores_its_candidates_in_full(seq_lens, hkv, group, ranks, device):
    """Candidates: each row's top M pages by the centroid estimate (forced pages first, every page when
    they fit), in page order with their first slots; their full scores come out in candidate order,
    and the partials of both launches merge into each head's total over the candidates' full scores
    and the other pages' estimates."""
    cfg = LocksConfig(token_budget=48, sink_pages=1, local_pages=1, prefilter=3, prefilter_rank=ranks)  # M = 9 pages
    c = random_cache(seq_lens, hkv, 128, device=device, seed=5 + group)
    bsz = len(seq_lens)
    rows, m = bsz * hkv, cfg.candidate_pages
    q = torch.randn(bsz, hkv * group, 128, device=device).bfloat16()
    max_pages = max(seq_lens) // 16 + 3
    args = (c["summaries"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"], max_pages, 128**-0.5)
    cand = candidate_buffer(rows + 2, cfg, device).fill_(-1)
    state = SelectionState(rows, device)
    scores, part_max, part_sum, got_cand, mass = locks_scores_triton(q, *args, cfg, state, cand)
    assert got_cand is cand and scores.shape == (bsz, hkv * group, m) and mass is None
    assert not state.hist.any() and not state.arrived.any()
    assert (cand[:, rows:] == -1).all()
    # The candidate selection's own input: the estimate launch's scores and partials.
    estimates, c_max, c_sum = score_pages_triton(q, *args, terms="estimate", estimate_rank=ranks)
    agg = aggregate_scores_triton(estimates, c_max, c_sum, c["seq_lens"], hkv, cfg.sink_pages, cfg.local_pages, "mass")
    flat = agg.view(rows, -1).cpu()
    want = select_pages_by_key_torch(flat.view(bsz, hkv, -1), key_offset_torch(c_max.cpu(), c_sum.cpu(), hkv, "mass"), m)
    full_ref = score_pages_torch(q.double(), *args)
    cent_ref = score_pages_torch(q.double(), *args, terms="estimate", estimate_rank=ranks)
    keep = torch.zeros(rows, max_pages, dtype=torch.bool)
    for row in range(rows):
        b, h = divmod(row, hkv)
        n = int(c["seq_lens"][b]) // 16
        k = min(n, m)
        pages, slots = cand[0, row, :k].cpu(), cand[1, row, :k].cpu()
        assert (cand[:, row, k:] == -1).all()
        assert torch.equal(pages, pages.sort().values) and (pages >= 0).all() and (pages < n).all()
        assert len(set(pages.tolist())) == k
        table = c["req_to_token"][int(c["req_pool_indices"][b])].cpu()
        assert torch.equal(slots, table[pages.long() * 16])
        if n > m:
            assert {0, n - 1} <= set(pages.tolist())  # sink and local pages
            if set(pages.tolist()) != set(want[row].tolist()):
                assert not interpreted(), "the interpreter computes the same keys in both"
                kth = flat[row, want[row]].min()
                swapped = sorted(set(pages.tolist()) ^ set(want[row].tolist()))
                assert (flat[row, swapped] - kth).abs().max() < 2 / KEY_SCALE.value
        keep[row, pages.long()] = True
        heads = slice(h * group, (h + 1) * group)
        assert torch.allclose(scores[b, heads, :k].double(), full_ref[b, heads][:, pages.long()], atol=1e-3, rtol=1e-3)
    keep = keep.view(bsz, hkv, 1, max_pages).expand(-1, -1, group, -1).reshape(bsz, hkv * group, max_pages)
    hybrid = torch.where(keep.to(device), full_ref, cent_ref)
    lse, lse_ref = _lse_of_partials(part_max, part_sum), torch.logsumexp(hybrid, -1)
    assert torch.equal(torch.isfinite(lse), torch.isfinite(lse_ref))
    fin = torch.isfinite(lse_ref)
    assert torch.allclose(lse[fin], lse_ref[fin], atol=1e-3, rtol=1e-3)


def test_prefilter_reference_ranks_only_the_best_pages_by_estimate(device):
    """locks_aggregate_torch: with the prefilter, each row ranks its top candidate_pages pages by their
    estimate (the rest -inf); without it, or when every page fits, all sealed pages."""
    seq_lens, hkv, group = [16 * 60 + 3, 16 * 7], 2, 4
    c = random_cache(seq_lens, hkv, 128, device=device, seed=9)
    q = torch.randn(2, hkv * group, 128, device=device, dtype=torch.float64)
    args = (c["summaries"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"], 60, 128**-0.5)
    exact = aggregate_scores_torch(score_pages_torch(q, *args), c["seq_lens"], hkv, 1, 1, "mass")
    assert torch.equal(locks_aggregate_torch(q, *args, LocksConfig(token_budget=48, prefilter=0)), exact)
    assert torch.equal(locks_aggregate_torch(q, *args, LocksConfig(token_budget=48, prefilter=20)), exact)  # 60 <= 60
    got = locks_aggregate_torch(q, *args, LocksConfig(token_budget=48, prefilter=3, prefilter_rank=2))
    cent = aggregate_scores_torch(score_pages_torch(q, *args, terms="estimate", estimate_rank=2), c["seq_lens"], hkv,
                                  1, 1, "mass")
    for b, n in enumerate((c["seq_lens"] // 16).tolist()):
        for h in range(hkv):
            ranked = got[b, h, :n] > float("-inf")
            if n <= 9:
                assert ranked.all()
                continue
            assert int(ranked.sum()) == 9
            assert torch.equal(ranked.nonzero().flatten().sort().values, cent[b, h, :n].topk(9).indices.sort().values)
            assert torch.isinf(got[b, h, [0, n - 1]]).all() and (got[b, h, [0, n - 1]] > 0).all()  # forced
