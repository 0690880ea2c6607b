"""benchmarks/summary_gather.py's gather-only kernel against its torch reference (interpreter on CPU)."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import summary_gather as sg  # noqa: E402

from sglang_locks.summaries import PageSummaries  # noqa: E402


def _summaries_and_table(hkv, n_sealed, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    s = PageSummaries.allocate(n_sealed + 3, hkv, 128, 8, "int8-int4-int8", device)
    for t, lo, hi in ((s.mu, -127, 128), (s.basis, 0, 256), (s.coef, -127, 128)):
        t.copy_(torch.randint(lo, hi, t.shape, generator=gen))
    s.mu_scale.copy_(torch.rand(s.mu_scale.shape, generator=gen))
    s.coef_scale.copy_(torch.rand(s.coef_scale.shape, generator=gen))
    order = torch.randperm(n_sealed, generator=gen)  # scattered pages; page 0 unused
    table = ((order + 1).to(torch.int32)[:, None] * 16 + torch.arange(16, dtype=torch.int32)).reshape(-1)
    return s, table.to(device)


@pytest.mark.parametrize("hkv, n_sealed, n_chunks, block_pages", [(2, 37, 3, 16), (8, 100, 5, 8), (1, 5, 4, 16),
                                                                  (2, 0, 2, 16), (2, 70, 1, 32)])
def test_gather_checksums_match_reference(hkv, n_sealed, n_chunks, block_pages, device):
    s, table = _summaries_and_table(hkv, n_sealed, device)
    sg.check(s, table, n_sealed, n_chunks, block_pages=block_pages)


def test_check_detects_a_wrong_page(device):
    s, table = _summaries_and_table(2, 30, device, seed=1)
    out = sg.gather_summaries(s, table, 30, 2).cpu()
    moved = table.clone()
    moved[16] = 32 * 16  # page 1 of the request read from another physical page
    words, _ = sg.gather_reference(s, moved, 30)
    assert not torch.equal(sg._xor(out[0], 1), words.cpu())
