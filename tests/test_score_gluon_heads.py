"""The G = 16 score kernel (score_pages_gluon_heads) against the float64 reference and score_pages_gluon (GPU)."""

import pytest
import torch

from helpers import assert_chunk_partials, assert_head_mass, random_cache
from sglang_locks.kernels.score_pages import int8_query, score_pages_torch
from sglang_locks.kernels.score_pages_gluon import STEP_PAIRS, score_pages_gluon
from sglang_locks.kernels.score_pages_gluon_heads import score_pages_gluon_heads

CASES = [([16 * 33], 1), ([16 * 37 + 5, 47, 3, 16 * 40], 2), ([0, 16 * 65 + 15, 200], 4), ([16 * 301 + 9, 16], 2)]


@pytest.mark.gpu
@pytest.mark.parametrize("seq_lens, hkv", CASES)
@pytest.mark.parametrize("chunk_pages", [None, 24, 200])
def test_heads_rows_scores_match_float64_reference(seq_lens, hkv, chunk_pages, device):
    c = random_cache(seq_lens, hkv, 128, device=device, seed=len(seq_lens) + hkv)
    q = torch.randn(len(seq_lens), hkv * 16, 128, device=device).bfloat16()
    # elements within 1e-3 of a half step of the kernel's int8 rounding (where its float32 division and the
    # reference's float64 one may round apart) set to 0
    x = q.double() / (q.double().abs().amax(-1, keepdim=True) / 127)
    q = q.masked_fill(((x - x.floor()) - 0.5).abs() < 1e-3, 0)
    max_pages = max(seq_lens) // 16 + 3
    args = (c["summaries"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"].long(), max_pages, 128**-0.5)
    mass = torch.full((q.shape[0] * q.shape[1] + 3, 4), 0.5, dtype=torch.float64, device=device)
    scores, part_max, part_sum = score_pages_gluon_heads(q, *args, chunk_pages=chunk_pages, mass=mass)
    # the kernel's basis term takes q rounded to int8 (a plane; score_pages_gluon's has two)
    ref = score_pages_torch(q.double(), *args, basis_q=int8_query(q))
    finite = torch.isfinite(ref)
    assert torch.isfinite(scores[finite]).all()
    excess = (scores[finite].double() - ref[finite]).abs() - 1e-3 - 1e-3 * ref[finite].abs()
    worst = int(excess.argmax())
    assert excess[worst] <= 0, (float(scores[finite][worst]), float(ref[finite][worst]),
                                float(score_pages_torch(q.double(), *args)[finite][worst]))
    # against the two planes' scores: within what the rounding moves them
    rows_pages = score_pages_gluon(q, *args, chunk_pages=chunk_pages)[0]
    moved = (ref - score_pages_torch(q.double(), *args)).abs()[finite]
    assert ((scores[finite] - rows_pages[finite]).abs().double() <= moved + 2e-3 + 1e-3 * ref[finite].abs()).all()
    assert_chunk_partials(part_max, part_sum, ref, c["seq_lens"], 2 * STEP_PAIRS, 1e-3)
    assert_head_mass(mass, 0.5, part_max, part_sum, ref, 1e-2)
