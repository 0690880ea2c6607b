"""shared_runs: the batch's groups of requests over the same physical pages, against a plain-Python reference."""

import pytest
import torch

from helpers import shared_prefix_batch as batch
from sglang_locks.shared_prefix import shared_runs, shared_runs_reference


CASES = [
    dict(groups=[(5, 16 * 37 + 5)], alone=0, own_pages=9),                       # one group, prefix ending mid-page
    dict(groups=[(3, 16 * 20), (4, 16 * 11 + 15), (1, 16 * 6)], alone=3, own_pages=5),
    dict(groups=[(4, 16 * 30 + 1), (2, 16 * 9)], alone=2, own_pages=4, diverge=True),
    dict(groups=[], alone=6, own_pages=3),                                        # nothing shared, some empty
    dict(groups=[(6, 7)], alone=1, own_pages=2),                                  # shared tokens, no shared page
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("chunk_pages", [1, 4])
def test_matches_the_reference(case, chunk_pages):
    for seed in range(3):
        args, sealed = batch(seed, **CASES[case])
        max_pages = max(1, max(len(t) for t in sealed)) + 5
        got = shared_runs(*args, max_pages, chunk_pages)
        want = shared_runs_reference(sealed, chunk_pages)
        for name in ("leader", "shared_pages", "members"):
            assert torch.equal(getattr(got, name), getattr(want, name)), (case, seed, name)


def test_shared_run_pages_are_the_same_physical_pages():
    args, sealed = batch(7, groups=[(8, 16 * 50 + 3), (3, 16 * 12)], alone=2, own_pages=6, diverge=True)
    runs = shared_runs(*args, max_pages=80, chunk_pages=2)
    assert int(runs.shared_pages.max()) > 0
    for b, t in enumerate(sealed):
        n, lead = int(runs.shared_pages[b]), sealed[int(runs.leader[b])]
        assert t[:n] == lead[:n] and n % 2 == 0
        if int(runs.members[b]) == 1:
            assert n == 0 and int(runs.leader[b]) == b


def test_bad_arguments_are_refused():
    args, _ = batch(0, groups=[(2, 64)], alone=0, own_pages=2)
    with pytest.raises(ValueError, match="chunk_pages and max_pages must be >= 1"):
        shared_runs(*args, max_pages=8, chunk_pages=0)


@pytest.mark.gpu
def test_runs_inside_a_cuda_graph():
    """No host sync: captured once, replayed on another batch of the same shape, it gives that batch's runs."""
    first, _ = batch(1, groups=[(4, 16 * 30)], alone=2, own_pages=4, device="cuda")
    second, sealed = batch(2, groups=[(4, 16 * 30)], alone=2, own_pages=4, device="cuda")
    width = max(first[0].shape[1], second[0].shape[1])
    static = [torch.zeros(first[0].shape[0], width, dtype=torch.int32, device="cuda"), first[1].clone(),
              first[2].clone()]
    static[0][:, : first[0].shape[1]] = first[0]
    shared_runs(*static, 40)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = shared_runs(*static, 40)
    static[0].zero_()
    static[0][:, : second[0].shape[1]] = second[0]
    static[1].copy_(second[1])
    static[2].copy_(second[2])
    graph.replay()
    want = shared_runs_reference(sealed)
    assert torch.equal(out.shared_pages.cpu(), want.shared_pages) and torch.equal(out.leader.cpu(), want.leader)
