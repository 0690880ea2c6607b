import pytest
import torch
import triton

from helpers import random_cache, slot_masses
from sglang_locks.config import LocksConfig
from sglang_locks.decode import locks_decode_reference
from sglang_locks.kernels._triton import interpreted, num_sms
from sglang_locks.kernels.aggregate_scores import (
    aggregate_scores_torch,
    aggregate_scores_triton,
    key_offset_torch,
    page_key_torch,
)
from sglang_locks.kernels.aggregate_scores import KEY_RANGE, KEY_SCALE
from sglang_locks.kernels import page_selection
from sglang_locks.kernels.page_selection import (
    MASS_SLOTS,
    CacheWrite,
    SelectionState,
    select_pages_by_key_torch,
    selected_indices_torch,
    PageScores,
    selected_indices_triton,
    PAGE_BLOCK,
    resident_parts,
    resident_programs,
    selection_parts,
    selection_tile,
    selection_tiles,
)
from sglang_locks.selection import pages_per_request, select_pages, selected_pages
from sglang_locks.sparse_decode import dense_decode_reference, per_head_pages, sparse_decode_reference


STEP = 1 / KEY_SCALE.value  # nats between selection keys


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


def _scored(seq_lens, hkv, group, seed, ties=False, chunks=1):
    """Random per-head scores (-inf past the sealed pages) and the (max, sum) partials of chunks chunks of
    pages, as score_pages_triton leaves them."""
    gen = torch.Generator().manual_seed(seed)
    max_pages = max(seq_lens) // 16 + 2
    scores = 3 * torch.randn(len(seq_lens), hkv * group, max_pages, generator=gen)
    if ties:  # few distinct values: many pages share the k-th key
        scores = scores.round()
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    scores = scores.masked_fill(torch.arange(max_pages) >= (lens.long() // 16)[:, None, None], float("-inf"))
    if chunks == 1:
        lse = torch.logsumexp(scores, -1, keepdim=True)
        return scores, lse.clone(), torch.ones_like(lse)
    parts = scores.tensor_split(chunks, -1)  # some chunks empty (all -inf) where pages are few
    part_max = torch.stack([x.amax(-1) if x.shape[-1] else scores[..., 0] * 0 - float("inf") for x in parts], -1)
    safe = torch.where(torch.isfinite(part_max), part_max, torch.zeros_like(part_max))
    part_sum = torch.stack([(x - safe[..., i, None]).exp().sum(-1) for i, x in enumerate(parts)], -1)
    return scores, part_max, part_sum


def _select(c, scored, hkv, cfg, state, cache_write=None, mass=None):
    """The kernel's page entries, written after -7 sentinels; (indptr, entries)."""
    device = c["seq_lens"].device
    indptr, last_page_len = selected_pages(c["seq_lens"].cpu(), hkv, cfg.budget_pages)
    indices = torch.full((int(indptr[-1]) + 5,), -7, dtype=torch.int32, device=device)
    last = torch.full((last_page_len.numel() + 1,), -7, dtype=torch.int32, device=device)
    scored = PageScores(*(t.to(device) for t in scored), mass=None if mass is None else mass.to(device))
    selected_indices_triton(scored, c["req_to_token"], c["req_pool_indices"], c["seq_lens"], indptr.to(device), indices,
                            last, hkv, cfg.sink_pages, cfg.local_pages, "mass", cfg.budget_pages, state,
                            cache_write=cache_write)
    assert (indices[int(indptr[-1]) :] == -7).all()  # nothing written past the rows
    assert torch.equal(last[:-1].cpu(), last_page_len) and int(last[-1]) == -7  # each row's last page: tail or 16
    return indptr, indices[: int(indptr[-1])].cpu()


CASES = [  # seq_lens (mixed: over and under budget, tails, empty), KV heads, group, budget
    ([16 * 50 + 7, 16 * 3 + 2, 9, 16 * 12], 3, 2, 160),
    ([16 * 11], 3, 4, 160),
    ([16 * 2500 + 3, 16 * 700], 1, 4, 160),    # a row over several programs, boundary bin spread over them
    ([16 * 2500 + 3], 3, 4, 160),              # one program, several blocks of pages
    ([16 * 5000, 16 * 4100 + 1], 2, 4, 160),   # several programs, several blocks each
    ([16 * 1700], 1, 4, 16 * 1500),            # budget over one block of pages
    ([16 * 6000, 16 * 900 + 5, 16 * 300], 1, 4, 160),  # rows much shorter than the scores' width: small tiles
    pytest.param([16 * 40000 + 3, 16 * 7000], 2, 4, 2048, marks=pytest.mark.gpu),  # 640K tokens: slow on CPU
    ([0, 16 * 40, 5], 1, 16, 16 * 4),
    ([16 * 300 + 1, 16 * 20], 2, 5, 160),     # 5 query heads per KV head (Qwen2.5-14B/32B)
]


@pytest.mark.parametrize("lse_from", ["partials", "slices", "mass"])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seq_lens, hkv, group, budget", CASES)
def test_indices_kernel_selects_top_keys_and_writes_pages(seq_lens, hkv, group, budget, ties, lse_from, device,
                                                          monkeypatch):
    """Each query head's total mass: from the score partials, each program merging all of them ("partials"),
    or merged in slices by the row's programs (a barrier more, the form of many chunks), or given as the
    Gluon score kernels add it up ("mass", which the launch zeroes)."""
    monkeypatch.setattr(page_selection, "SPLIT_MERGE_ABOVE", 0 if lse_from == "slices" else 10**9)
    cfg = LocksConfig(token_budget=budget, sink_pages=1, local_pages=2)
    c = random_cache(seq_lens, hkv, 64, device=device)
    # Scores follow the cache's (shuffled) batch order, so lengths come from the cache.
    lens = c["seq_lens"].cpu().tolist()
    state = SelectionState(len(lens) * hkv, device)
    for seed in (budget, budget + 1):  # the second launch finds the state the first one left
        scored = _scored(lens, hkv, group, seed=seed, ties=ties, chunks=37)
        mass = slot_masses(*scored[1:], MASS_SLOTS).to(device) if lse_from == "mass" else None
        indptr, got = _select(c, scored, hkv, cfg, state, mass=mass)
        assert not state.hist.any() and not state.arrived.any()  # cleared for the next launch
        assert mass is None or not mass.any()
        # The reference ranks the aggregation kernel's agg by the same keys.
        agg = aggregate_scores_triton(*(t.to(device) for t in scored), c["seq_lens"], hkv, cfg.sink_pages,
                                      cfg.local_pages, "mass").cpu()
        offset = key_offset_torch(scored[1], scored[2], hkv, "mass")
        want_sel = select_pages_by_key_torch(agg, offset, cfg.budget_pages)
        indptr_ref, want = selected_indices_torch(want_sel, c["req_to_token"].cpu(), c["req_pool_indices"].cpu(),
                                                  c["seq_lens"].cpu(), hkv, cfg.budget_pages)
        assert torch.equal(indptr, indptr_ref)
        flat = agg.view(-1, agg.shape[-1])
        for row in range(flat.shape[0]):
            b, h = divmod(row, hkv)
            n = int(c["seq_lens"][b])
            table = c["req_to_token"][int(c["req_pool_indices"][b])].cpu().long()
            page_of = {int(table[p * 16]) * hkv + h: p for p in range(-(-n // 16))}
            pages = [page_of[int(e)] for e in got[indptr[row] : indptr[row + 1]]]
            assert pages == sorted(pages)  # logical order, the tail page (if any) last
            if n % 16:
                assert pages[-1] == n // 16
            want_pages = [page_of[int(e)] for e in want[indptr[row] : indptr[row + 1]]]
            if pages != want_pages:
                # The two kernels' float32 agg may round a key differently: only near-ties may swap.
                assert lse_from != "partials" or not interpreted(), "the interpreter runs both kernels' math alike"
                kth = flat[row, want_sel[row]].min()
                swapped = sorted(set(pages) ^ set(want_sel[row].tolist()) - {n // 16})
                assert (flat[row, swapped] - kth).abs().max() < 2 * STEP
            if n // 16 > cfg.budget_pages:
                taken = want_sel[row]
                left = torch.ones(n // 16, dtype=torch.bool)
                left[taken] = False
                # The key rule is the top-k up to ties within one key step, where shares lie above
                # e^-KEY_RANGE (below it all pages share the lowest key).
                floor = float(offset[row]) - KEY_RANGE.value
                assert flat[row, taken].min() >= min(flat[row, : n // 16][left].max(), floor) - STEP
                assert set(taken.tolist()) >= {0, n // 16 - 2, n // 16 - 1}


@pytest.mark.parametrize("seq_lens, hkv, group, budget, m", [
    ([16 * 50 + 7, 16 * 3 + 2, 9, 16 * 12], 3, 2, 160, 20),   # rows over M, between budget and M, under budget
    ([16 * 900 + 3, 16 * 40], 2, 4, 160, 600),                 # candidates over several programs
    ([16 * 30], 1, 16, 64, 8),
])
def test_selection_among_candidates_writes_the_top_candidates_pages(seq_lens, hkv, group, budget, m, device):
    """The final selection of a prefiltered step: scores in candidate order, forced pages by their
    logical page, entries of the chosen candidates' pages (in candidate = page order), then the tail."""
    cfg = LocksConfig(token_budget=budget, sink_pages=1, local_pages=2)
    c = random_cache(seq_lens, hkv, 64, device=device)
    lens = c["seq_lens"].cpu()
    bsz, rows = len(seq_lens), len(seq_lens) * hkv
    gen = torch.Generator().manual_seed(m)
    cand = torch.full((2, rows + 1, m), -1, dtype=torch.int32)
    scores = torch.full((bsz, hkv * group, m), float("-inf"))
    for row in range(rows):
        b = row // hkv
        n = int(lens[b]) // 16
        k = min(n, m)
        forced = [0] + list(range(max(1, n - 2), n)) if n > m else []
        rest = torch.tensor([p for p in range(n) if p not in forced], dtype=torch.long)
        rest = rest[torch.randperm(len(rest), generator=gen)][: k - len(forced)].long()
        pages = torch.cat([torch.tensor(forced, dtype=torch.long), rest])
        pages = pages.sort().values
        table = c["req_to_token"][int(c["req_pool_indices"][b])].cpu()
        cand[0, row, :k], cand[1, row, :k] = pages.int(), table[pages * 16]
        scores[b, (row % hkv) * group:(row % hkv + 1) * group, :k] = 3 * torch.randn(group, k, generator=gen)
    lse = torch.logsumexp(scores, -1, keepdim=True)
    indptr, last_page_len = selected_pages(lens, hkv, cfg.budget_pages)
    indices = torch.full((int(indptr[-1]) + 5,), -7, dtype=torch.int32, device=device)
    last = torch.full((rows,), -7, dtype=torch.int32, device=device)
    state = SelectionState(rows, device)
    scored = PageScores(scores.to(device), lse.to(device), torch.ones_like(lse).to(device), cand.to(device))
    selected_indices_triton(scored, c["req_to_token"], c["req_pool_indices"], c["seq_lens"], indptr.to(device), indices,
                            last, hkv, cfg.sink_pages, cfg.local_pages, "mass", cfg.budget_pages, state)
    assert not state.hist.any() and not state.arrived.any()
    assert torch.equal(last.cpu(), last_page_len)
    got = indices.cpu()
    assert (got[int(indptr[-1]):] == -7).all()
    # Reference: aggregate in candidate order, forced by logical page, ranked by the kernel's keys.
    agg = aggregate_scores_torch(scores.double(), torch.full((bsz,), 16 * m), hkv, 0, 0, "mass").view(rows, m)
    offset = key_offset_torch(lse, torch.ones_like(lse), hkv, "mass")
    for row in range(rows):
        b, h = divmod(row, hkv)
        n = int(lens[b]) // 16
        k = min(n, m)
        pages = cand[0, row, :k].long()
        agg[row, :k] = torch.where((pages < cfg.sink_pages) | (pages >= n - cfg.local_pages), float("inf"), agg[row, :k])
        agg[row, k:] = float("-inf")
    items = select_pages_by_key_torch(agg.view(bsz, hkv, m), offset, cfg.budget_pages)
    for row in range(rows):
        b, h = divmod(row, hkv)
        n, seq_len = int(lens[b]) // 16, int(lens[b])
        table = c["req_to_token"][int(c["req_pool_indices"][b])].cpu().long()
        pages = list(range(n)) if n <= cfg.budget_pages else cand[0, row, items[row]].long().tolist()
        if seq_len % 16:
            pages.append(n)  # the tail page
        want = table[torch.tensor(pages, dtype=torch.long) * 16] * hkv + h
        assert torch.equal(got[int(indptr[row]):int(indptr[row + 1])].long(), want), row


def test_equal_scores_over_several_blocks_take_the_first_pages(device):
    """Every free page ties: the budget's free slots go to the first pages, forced pages keep their place."""
    n_pages, hkv = 3000, 1
    cfg = LocksConfig(token_budget=16 * 8, sink_pages=1, local_pages=2)
    c = random_cache([16 * n_pages + 5], hkv, 64, device=device)
    scores = torch.zeros(1, 4, n_pages)
    part = torch.zeros(1, 4, 1)
    scored = (scores, part + torch.log(torch.tensor(float(n_pages))), part + 1)
    _, got = _select(c, scored, hkv, cfg, SelectionState(1, device))
    table = c["req_to_token"][int(c["req_pool_indices"][0])].cpu().long()
    pages = [0, 1, 2, 3, 4, 5, n_pages - 2, n_pages - 1, n_pages]  # the tail page last
    assert torch.equal(got.long(), table[torch.tensor(pages) * 16] * hkv)


def test_pages_below_the_key_range_fill_the_budget_in_page_order(device):
    """Shares below e^-KEY_RANGE all get the lowest key: after the pages above it, the budget's
    remaining slots go to the first such pages, over several programs."""
    n_pages, hkv = 3000, 1
    cfg = LocksConfig(token_budget=16 * 8, sink_pages=1, local_pages=2)
    c = random_cache([16 * n_pages + 5], hkv, 64, device=device)
    scores = torch.full((1, 4, n_pages), -60.0)
    high = [1500, 2100]
    scores[..., high] = 0.0
    lse = torch.logsumexp(scores, -1, keepdim=True)
    _, got = _select(c, (scores, lse, torch.ones_like(lse)), hkv, cfg, SelectionState(1, device))
    table = c["req_to_token"][int(c["req_pool_indices"][0])].cpu().long()
    pages = [0, 1, 2, 3, 1500, 2100, n_pages - 2, n_pages - 1, n_pages]  # the tail page last
    assert torch.equal(got.long(), table[torch.tensor(pages) * 16] * hkv)


@pytest.mark.parametrize("sms", [4, 132])
def test_selection_grid_stays_resident(monkeypatch, sms):
    """The kernel's row barrier needs every program of the grid resident at once: within resident_programs per SM
    of its tile, or 2 per SM (any registers). 4 SMs: the interpreter's; 132: the H200's."""
    monkeypatch.setattr(page_selection, "num_sms", lambda device: sms)
    device = torch.device("cpu")
    for rows in (1, 2, 7, 32, 64, 1000):
        for max_pages in (1, 1024, 8256, 16448, 70000):
            for group in (1, 4, 16):
                parts = selection_parts(rows, max_pages, device, group)
                tile = selection_tile(max_pages, parts, group)
                assert parts >= 1 and (parts == 1 or rows * parts <= max(resident_programs(tile, group), 2) * sms)
                assert parts <= -(-max_pages // PAGE_BLOCK)


def test_selection_grid_takes_the_smallest_resident_tile(monkeypatch):
    """H200 (132 SMs): Llama-3.1-8B bs=4 in a 132096-token graph gets 17 programs per row of 512-page tiles (8 of
    2048, half masked, under 2 programs per SM); where no tile's programs fit, 2 per SM as before."""
    monkeypatch.setattr(page_selection, "num_sms", lambda device: 132)
    cpu = torch.device("cpu")
    assert selection_parts(32, 8256, cpu, 4) == 17 and selection_tile(8256, 17, 4) == 512
    assert selection_parts(8, 8256, cpu, 4) == 17                           # bs=1: as before
    assert selection_parts(8, 65536, cpu, 4) == 128                         # bs=1 1M: 512-page tiles, not 33 of 2048
    assert selection_parts(64, 8256, cpu, 4) == 4                           # bs=8: none fits, 2 per SM
    assert selection_parts(2, 65536, cpu, 16) == 128                        # GLM-4-9B-1M 1M: as before
    assert [resident_programs(t, 4) for t in (256, 512, 1024, 2048)] == [8, 8, 4, 2]
    assert [resident_programs(t, 1) for t in (1024, 2048, 8192)] == [4, 2, 2]
    assert resident_programs(512, 8) == 4 and resident_programs(512, 16) == 2


def test_resident_parts_keeps_grids_that_fit_and_shrinks_the_others():
    assert resident_parts(8, 17, 132, 8) == 17          # Llama-3.1-8B bs=1 128K on the H200
    assert resident_parts(64, 17, 132, 0) == 17         # the driver could not say: the model's choice
    assert resident_parts(64, 17, 132, 4) == 8          # 528 resident programs for 64 rows
    assert resident_parts(1000, 4, 132, 2) == 1         # fewer resident programs than rows: no barrier at all


def test_resident_grid_asks_the_driver_until_the_grid_fits(monkeypatch):
    """_resident_grid compiles each candidate grid (warmup, no launch) and shrinks it while the driver's
    occupancy of that build says its programs do not all fit (here, on 8 SMs: 3 per SM at 512-page tiles,
    1 at larger ones)."""
    asked = []

    class Kernel:
        @staticmethod
        def warmup(*args, grid, **consts):
            asked.append(grid[1])
            return consts

    monkeypatch.setattr(page_selection, "_select_kernel", Kernel)
    monkeypatch.setattr(page_selection, "resident_blocks", lambda consts: 3 if consts["BLOCK"] <= 512 else 1)

    def grid(parts):
        return (), dict(BLOCK=selection_tile(8256, parts, 4), SYNC=parts > 1)

    # 2 rows: 17 -> 12 (3 x 8 SMs / 2 rows; 1024-page tiles: 1 per SM) -> 4 (2048-page tiles, 1 per SM: fits)
    assert page_selection._resident_grid(grid, 2, 17, 8, {}) == 4
    assert asked == [17, 12, 4]
    assert page_selection._resident_grid(grid, 32, 17, 8, {}) == 1   # fewer resident programs than rows
    assert page_selection._resident_grid(grid, 2, 1, 8, {}) == 1     # one program: never asked
    assert asked == [17, 12, 4, 17]


@pytest.mark.gpu
@pytest.mark.parametrize("rows, width, group", [(8, 8256, 4), (32, 8256, 4), (64, 8256, 4), (8, 65600, 4),
                                                (2, 65600, 16), (2, 8256, 16)])
def test_driver_confirms_the_selection_grids_resident_programs(rows, width, group, monkeypatch):
    """On the GPU the driver's occupancy of each grid's build holds selection_parts' programs (Llama-3.1-8B
    bs=1/4/8 at 128K, bs=1 1M; GLM-4-9B-1M 1M and 128K): the model did not overestimate."""
    from sglang_locks.kernels._triton import resident_blocks

    monkeypatch.setattr(page_selection, "_RESIDENT_PARTS", {})
    device = torch.device("cuda")
    hkv = rows if group == 4 else 2
    bsz = rows // hkv
    scores = torch.zeros(bsz, hkv * group, width, device=device)
    partials = torch.zeros(bsz, hkv * group, 16, device=device)
    lens = torch.full((bsz,), width * 16, dtype=torch.int64, device=device)
    table = torch.zeros(bsz, width * 16 + 16, dtype=torch.int32, device=device)
    parts = selection_parts(rows, width, device, group)
    seen = []
    monkeypatch.setattr(page_selection, "resident_blocks", lambda compiled: seen.append(resident_blocks(compiled))
                        or seen[-1])
    indptr = torch.arange(rows + 1, dtype=torch.int32, device=device) * 129
    selected_indices_triton(PageScores(scores, partials, partials), table, torch.arange(bsz, device=device), lens,
                            indptr, torch.empty(rows * 129, dtype=torch.int32, device=device),
                            torch.empty(rows, dtype=torch.int32, device=device), hkv, 1, 1, "mass", 128,
                            SelectionState(rows, device))
    torch.cuda.synchronize()
    assert seen and seen[0] > 0 and rows * parts <= seen[0] * num_sms(device)
    assert list(page_selection._RESIDENT_PARTS.values()) == [parts]


@pytest.mark.gpu
def test_a_grid_the_driver_cannot_fit_is_launched_smaller_and_selects_the_same(monkeypatch):
    """With the driver reporting one resident program per SM, a 2-row selection of 79 programs per row gets
    sms // 2 (66 on the H200) and writes the same entries."""
    seq_lens, hkv, group, budget = [16 * 40000 + 3, 16 * 7000], 1, 4, 2048
    cfg = LocksConfig(token_budget=budget, sink_pages=1, local_pages=2)
    c = random_cache(seq_lens, hkv, 64, device="cuda")
    lens = c["seq_lens"].cpu().tolist()
    scored = _scored(lens, hkv, group, seed=3, chunks=37)
    monkeypatch.setattr(page_selection, "_RESIDENT_PARTS", {})
    _, want = _select(c, scored, hkv, cfg, SelectionState(2, "cuda"))
    (usual,) = page_selection._RESIDENT_PARTS.values()
    monkeypatch.setattr(page_selection, "_RESIDENT_PARTS", {})
    monkeypatch.setattr(page_selection, "resident_blocks", lambda compiled: 1)
    _, got = _select(c, scored, hkv, cfg, SelectionState(2, "cuda"))
    (fewer,) = page_selection._RESIDENT_PARTS.values()
    assert 1 < fewer < usual and 2 * fewer <= num_sms(torch.device("cuda"))
    assert torch.equal(got, want)


def test_selection_tile_covers_a_program_span_within_the_register_cap():
    for items, parts, group in ((8192, 16, 4), (65536, 33, 4), (65536, 128, 16), (5, 1, 1), (70000, 3, 32)):
        tile = selection_tile(items, parts, group)
        assert selection_tiles(items, parts, group) == (tile, tile if group >= 8 else max(16, tile // 4))
        assert tile & (tile - 1) == 0 and tile >= 16
        span = -(-items // parts)
        assert tile >= span or tile * triton.next_power_of_2(group) == 8192
        assert tile * triton.next_power_of_2(group) <= 8192 or tile == 16


def test_key_rule_is_exact_top_k_without_near_ties():
    agg = torch.tensor([[[-3.0, -1.0, -2.5, float("inf"), -0.5, float("-inf"), -7.0]]])
    sel = select_pages_by_key_torch(agg, torch.zeros(1), 3)
    assert sel.tolist() == [[1, 3, 4]]
    assert page_key_torch(torch.tensor([[-16.5, -1.0, -1.03, 0.0, float("inf")]]), torch.zeros(1)).tolist() == [
        [0, 240, 239, 254, 255]]


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


def test_sparse_reference_on_explicit_pages():
    k = torch.randn(80, 2, 8)
    v = torch.randn(80, 2, 8)
    q = torch.randn(1, 2, 8)
    indptr = torch.tensor([0, 2, 3])
    last_page_len = torch.tensor([5, 16])
    # Head 0: the page at slot 32, then 5 tokens of the page at slot 16; head 1: the page at slot 64.
    indices = torch.tensor([32 * 2 + 0, 16 * 2 + 0, 64 * 2 + 1], dtype=torch.int32)
    out = sparse_decode_reference(q, k, v, indptr, indices, last_page_len, 2, 0.3)
    slots = list(range(32, 48)) + list(range(16, 21))
    p = torch.softmax(q[0, 0] @ k[slots, 0].T * 0.3, -1)
    assert torch.allclose(out[0, 0], p @ v[slots, 0], atol=1e-6)
    p = torch.softmax(q[0, 1] @ k[64:80, 1].T * 0.3, -1)
    assert torch.allclose(out[0, 1], p @ v[64:80, 1], atol=1e-6)


def test_selected_pages_layout():
    indptr, last = selected_pages(torch.tensor([16 * 300 + 5, 16 * 7, 9, 0]), 2, 128)
    assert indptr.tolist() == [0, 129, 258, 265, 272, 273, 274, 274, 274]
    assert last.tolist() == [5, 5, 16, 16, 9, 9, 16, 16]


def test_pages_per_request_is_the_plans_pages_per_row():
    """The host's per-step check whether FlashInfer must plan again (plain Python) against the layout it plans."""
    gen = torch.Generator().manual_seed(3)
    for budget in (1, 7, 128):
        lens = torch.randint(0, 16 * 3 * budget, (9,), generator=gen)
        lens[:4] = torch.tensor([0, 16 * budget, 16 * budget + 1, 16 * (budget + 1)])
        indptr, _ = selected_pages(lens, 3, budget)
        assert list(pages_per_request(lens.tolist(), budget)) == indptr.diff()[::3].tolist()


def _step_kv(c, hkv, d, seed):
    """The step's keys and values [B, H_kv, d] (every other row from a strided buffer, as SGLang's split of qkv
    leaves them) and distinct random slots [B] (int64, like SGLang's out_cache_loc)."""
    gen = torch.Generator().manual_seed(seed)
    bsz = c["seq_lens"].numel()
    qkv = torch.randn(bsz, 3, hkv, d, generator=gen).to(c["k_cache"].dtype)
    loc = torch.randperm(c["k_cache"].shape[0] - 1, generator=gen)[:bsz] + 1
    device = c["k_cache"].device
    return qkv[:, 1].to(device), qkv[:, 2].to(device), loc.to(device)


@pytest.mark.parametrize("seq_lens, hkv, group, budget", [
    ([16 * 50 + 7, 16 * 3 + 2, 9, 16 * 12], 3, 2, 160),   # rows over and under the budget, tails, a short one
    ([16 * 2500 + 3, 16 * 700], 1, 4, 160),               # rows over several programs
    ([0, 16 * 40, 5], 2, 16, 16 * 4),
])
def test_selection_writes_the_steps_keys_and_values(seq_lens, hkv, group, budget, device):
    """With a CacheWrite the selection also stores each request's key and value of every KV head at its slot (but
    slot 0's), and selects the same pages; every other cache entry stays as it was."""
    cfg = LocksConfig(token_budget=budget, sink_pages=1, local_pages=2)
    c = random_cache(seq_lens, hkv, 64, device=device)
    lens = c["seq_lens"].cpu().tolist()
    scored = _scored(lens, hkv, group, seed=1, chunks=37)
    want = _select(c, scored, hkv, cfg, SelectionState(len(lens) * hkv, device))
    k, v, loc = _step_kv(c, hkv, 64, seed=2)
    loc[0] = 0  # a CUDA graph's padding row: not written
    k_want, v_want = c["k_cache"].clone(), c["v_cache"].clone()
    k_want[loc[1:]], v_want[loc[1:]] = k[1:], v[1:]
    write = CacheWrite(k, v, c["k_cache"], c["v_cache"], loc)
    got = _select(c, scored, hkv, cfg, SelectionState(len(lens) * hkv, device), write)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(c["k_cache"], k_want) and torch.equal(c["v_cache"], v_want)


def test_cache_write_is_checked():
    c = random_cache([16 * 40, 9], 2, 64)
    k, v, loc = _step_kv(c, 2, 64, seed=0)
    kc, vc = c["k_cache"], c["v_cache"]
    with pytest.raises(ValueError, match=r"CacheWrite.k must be \[2, 2, 64\]"):
        CacheWrite(k[:1], v, kc, vc, loc).check(2, 2)
    with pytest.raises(ValueError, match="unit stride"):
        CacheWrite(k.transpose(1, 2).contiguous().transpose(1, 2), v, kc, vc, loc).check(2, 2)
    with pytest.raises(ValueError, match="contiguous"):
        CacheWrite(k, v, kc, vc[::2], loc).check(2, 2)
    with pytest.raises(ValueError, match="no conversion"):
        CacheWrite(k.float(), v, kc, vc, loc).check(2, 2)
    with pytest.raises(ValueError, match="loc must hold"):
        CacheWrite(k, v, kc, vc, loc[:1]).check(2, 2)


def test_selection_state_and_cache_layout_are_checked():
    scored = _scored([16 * 40], 2, 4, seed=0)
    c = random_cache([16 * 40], 2, 64)
    with pytest.raises(ValueError, match="exceed the SelectionState"):
        _select(c, scored, 2, LocksConfig(token_budget=160), SelectionState(1, "cpu"))
    cache = torch.zeros(64, 2, 8)
    view = per_head_pages(cache)
    cache[16 + 3, 1] = 1.0  # token 3 of the page of head 1 starting at slot 16: entry 16 * 2 + 1
    assert view.shape == ((64 - 15) * 2, 16, 1, 8) and view[16 * 2 + 1, 3, 0].sum() == 8
    with pytest.raises(ValueError, match="contiguous"):
        per_head_pages(cache.transpose(0, 1).contiguous().transpose(0, 1))
