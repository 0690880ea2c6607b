"""shared_runs: the batch's groups of requests over the same physical pages, against a plain-Python reference."""

import random

import pytest
import torch

from sglang_locks.shared_prefix import shared_runs, shared_runs_reference


def batch(seed, groups, alone, own_pages, diverge=False, device="cpu"):
    """SGLang-like tables: each group's requests start on the same physical pages (a prefix of shared_len
    tokens, possibly ending mid-page: the page holding its end is each request's own), then own pages; some
    requests share nothing; with diverge, one member of each group leaves the prefix early."""
    rng = random.Random(seed)
    next_page = iter(rng.sample(range(1, 5000), 4999))
    tables, lens = [], []
    for members, shared_len in groups:
        prefix = [next(next_page) for _ in range(shared_len // 16)]
        for m in range(members):
            own_len = rng.randrange(0, own_pages * 16)
            pages = list(prefix)
            if diverge and m == members - 1 and len(pages) > 2:
                cut = rng.randrange(1, len(pages))
                pages = pages[:cut] + [next(next_page) for _ in range(len(pages) - cut)]
            n = len(pages) * 16 + (shared_len % 16) + own_len
            pages += [next(next_page) for _ in range(-(-n // 16) - len(pages))]
            tables.append(pages)
            lens.append(n)
    for _ in range(alone):
        n = rng.randrange(0, own_pages * 16)
        tables.append([next(next_page) for _ in range(-(-n // 16))])
        lens.append(n)
    order = list(range(len(lens)))
    rng.shuffle(order)
    tables, lens = [tables[i] for i in order], [lens[i] for i in order]
    width = max(max(lens), 1) + 16
    req_to_token = torch.zeros(len(lens) + 3, width, dtype=torch.int32)
    rpi = torch.tensor(rng.sample(range(1, len(lens) + 3), len(lens)), dtype=torch.int32)
    for r, pages, n in zip(rpi.tolist(), tables, lens):
        slots = (torch.tensor(pages, dtype=torch.int64)[:, None] * 16 + torch.arange(16)).flatten()[:n]
        req_to_token[r, :n] = slots.to(torch.int32)
    sealed = [t[: n // 16] for t, n in zip(tables, lens)]
    return (req_to_token.to(device), rpi.to(device), torch.tensor(lens, dtype=torch.int32, device=device)), sealed


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
