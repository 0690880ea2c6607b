"""FlashInfer sparse decode and the whole LOCKS step on the GPU, against torch references."""

import pytest
import torch

from helpers import random_cache
from sglang_locks.config import SPARSE_DECODE_KERNELS, LocksConfig
from sglang_locks.decode import LocksDecode
from sglang_locks.kernels._triton import CHAIN_KERNELS, dependent_kernels
from sglang_locks.kernels.aggregate_scores import KEY_SCALE
from sglang_locks.kernels.page_selection import CacheWrite, selected_indices_torch
from sglang_locks.selection import selected_pages
from sglang_locks.sparse_decode import SparseDecodeWrapper, dense_decode_reference, sparse_decode_reference

pytestmark = pytest.mark.gpu

SHAPES = [  # seq_lens, KV heads, group
    ([16 * 300 + 5, 77, 16 * 129], 8, 4),
    ([16 * 500 + 11], 2, 16),
    ([9, 16 * 140 + 1, 16 * 200, 3000], 4, 8),
    ([16 * 260 + 15, 40], 2, 1),
    ([16 * 350 + 6, 16 * 40 + 1], 4, 7),   # Qwen2.5-7B: 7 query heads per KV head
]


def _workspace():
    return torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("kernel", SPARSE_DECODE_KERNELS)
@pytest.mark.parametrize("seq_lens, hkv, group", SHAPES)
def test_sparse_decode_matches_reference(seq_lens, hkv, group, kernel):
    c = random_cache(seq_lens, hkv, 128, device="cuda", seed=group)
    cfg = LocksConfig(token_budget=512)
    bsz = len(seq_lens)
    q = torch.randn(bsz, hkv * group, 128, device="cuda", dtype=torch.bfloat16)
    dec = SparseDecodeWrapper(_workspace(), hkv * group, hkv, 128, bsz, bsz * hkv * (cfg.budget_pages + 1),
                              kernel=kernel)
    dec.plan(c["seq_lens"].cpu(), cfg.budget_pages, torch.bfloat16, torch.bfloat16, 128**-0.5)
    # Random page picks per row exercise arbitrary page lists.
    max_pages = max(seq_lens) // 16
    sel = torch.stack([torch.randperm(max(max_pages, 1))[: min(cfg.budget_pages, max_pages)] for _ in range(bsz * hkv)])
    indptr, indices = selected_indices_torch(sel, c["req_to_token"].cpu(), c["req_pool_indices"].cpu(), c["seq_lens"].cpu(), hkv, cfg.budget_pages)
    plan_indptr, last_page_len = selected_pages(c["seq_lens"].cpu(), hkv, cfg.budget_pages)
    assert torch.equal(indptr, plan_indptr)
    dec.indices[: indices.numel()].copy_(indices)
    out = dec.run(q, c["k_cache"], c["v_cache"])
    ref = sparse_decode_reference(q, c["k_cache"], c["v_cache"], indptr, indices, last_page_len, hkv, 128**-0.5)
    assert _rel(out, ref) < 1e-2


@pytest.mark.parametrize("seq_lens, hkv, group", SHAPES)
@pytest.mark.parametrize("precision", ["int8-int4-int8", "fp32"])
@pytest.mark.parametrize("prefilter", [0, 4])  # 4: 64 candidate pages of 300-500
@pytest.mark.parametrize("kernel", SPARSE_DECODE_KERNELS)
def test_locks_step_matches_reference(seq_lens, hkv, group, precision, prefilter, kernel):
    c = random_cache(seq_lens, hkv, 128, precision, device="cuda", seed=11 + group)
    cfg = LocksConfig(token_budget=256, summary_precision=precision, prefilter=prefilter, sparse_decode=kernel)
    bsz = len(seq_lens)
    q = torch.randn(bsz, hkv * group, 128, device="cuda", dtype=torch.bfloat16)
    dec = LocksDecode(cfg, _workspace(), hkv * group, hkv, 128, bsz)
    dec.plan(c["seq_lens"].cpu(), torch.bfloat16, torch.bfloat16)
    out = dec.run(q, c["k_cache"], c["v_cache"], c["summaries"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"])
    state = dec.selection_state
    # cleared for the next launch: the barrier counters, histograms and the masses the score kernel added up
    assert not state.hist.any() and not state.arrived.any() and not state.mass.any()
    indptr, last_page_len = selected_pages(c["seq_lens"].cpu(), hkv, cfg.budget_pages)
    got = dec.sparse.indices[: int(indptr[-1])].cpu()
    # Attention over the pages the GPU picked, within bf16 precision.
    ref = sparse_decode_reference(q, c["k_cache"], c["v_cache"], indptr, got, last_page_len, hkv, 128**-0.5)
    assert _rel(out, ref) < 1e-2
    # The picks are the float64 reference's but for near-ties: a page swapped in or out lies within
    # one selection-key step (plus the kernels' rounding) of the reference's k-th aggregated score, or
    # (prefiltered) of the k-th centroid estimate that decided the candidates.
    _, want, agg, centroid_agg = selected_indices_reference(q, c, cfg)
    same = sum(len(set(got[a:b].tolist()) & set(want[a:b].tolist())) for a, b in zip(indptr[:-1], indptr[1:]))
    assert same >= 0.9 * len(want)
    step = 1 / KEY_SCALE.value
    agg = agg.view(bsz * hkv, -1).cpu()
    for row in range(bsz * hkv):
        a, b = int(indptr[row]), int(indptr[row + 1])
        swapped = set(got[a:b].tolist()) ^ set(want[a:b].tolist())
        if not swapped:
            continue
        req = int(c["req_pool_indices"][row // hkv])
        page_of = {int(slot) * hkv + row % hkv: p for p, slot in enumerate(c["req_to_token"][req, ::16].tolist())}
        n_sealed = int(c["seq_lens"][row // hkv]) // 16  # the tail page, always taken, has no score
        want_pages = torch.tensor([page_of[e] for e in want[a:b].tolist() if page_of[e] < n_sealed])
        taken = agg[row, want_pages]
        kth = taken[torch.isfinite(taken)].min()
        swapped_pages = [page_of[e] for e in swapped]
        if centroid_agg is not None:  # pages the kernel and the reference disagree to be candidates
            m = cfg.candidate_pages
            cand = set(dec.candidates[0, row, : min(n_sealed, m)].tolist())
            ref_cand = set((agg[row] > float("-inf")).nonzero().flatten().tolist())
            cent = centroid_agg.view(bsz * hkv, -1)[row, :n_sealed].cpu()
            # A row of at most m sealed pages has them all as candidates on both sides: nothing to compare.
            kth_cent = cent.topk(min(m, n_sealed)).values[-1]
            for p in [p for p in swapped_pages if (p in cand) != (p in ref_cand)]:
                assert abs(cent[p] - kth_cent) < 2 * step + 0.02, (row, p)
            swapped_pages = [p for p in swapped_pages if p in cand and p in ref_cand]
            if not swapped_pages:
                continue
        gap = (agg[row, torch.tensor(swapped_pages)] - kth).abs()
        assert gap.max() < 2 * step + 0.02, (row, gap)


def selected_indices_reference(q, c, cfg):
    from sglang_locks.kernels.aggregate_scores import aggregate_scores_torch
    from sglang_locks.kernels.score_pages import score_pages_torch
    from sglang_locks.scoring import locks_aggregate_torch, prefiltered
    from sglang_locks.selection import select_pages

    hkv = c["summaries"].num_kv_heads
    max_pages = max(1, int(c["seq_lens"].max()) // 16)
    args = (q.double(), c["summaries"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"], max_pages, 128**-0.5)
    agg = locks_aggregate_torch(*args, cfg)
    centroid_agg = None
    if prefiltered(cfg, max_pages):
        centroid_agg = aggregate_scores_torch(score_pages_torch(*args, terms="estimate", estimate_rank=cfg.prefilter_rank),
                                              c["seq_lens"], hkv, cfg.sink_pages, cfg.local_pages, cfg.gqa_aggregation)
    sel = select_pages(agg, cfg.budget_pages)
    indptr, indices = selected_indices_torch(sel.cpu(), c["req_to_token"].cpu(), c["req_pool_indices"].cpu(),
                                             c["seq_lens"].cpu(), hkv, cfg.budget_pages)
    return indptr, indices, agg, centroid_agg


@pytest.mark.parametrize("seq_lens, hkv, group", SHAPES)
@pytest.mark.parametrize("kernel", SPARSE_DECODE_KERNELS)
@pytest.mark.parametrize("write_kv", [False, True])
def test_budget_covering_context_equals_dense(seq_lens, hkv, group, kernel, write_kv):
    """write_kv: each request's last key and value reach the caches through run's new_kv (the selection
    writes them), over stale entries, as in a decode step of SGLang."""
    c = random_cache(seq_lens, hkv, 128, device="cuda", seed=5)
    budget = (max(seq_lens) // 16 + 1) * 16
    cfg = LocksConfig(token_budget=budget, sparse_decode=kernel)
    bsz = len(seq_lens)
    q = torch.randn(bsz, hkv * group, 128, device="cuda", dtype=torch.bfloat16)
    ref = dense_decode_reference(q, c["k_cache"], c["v_cache"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"], 128**-0.5)
    new_kv = None
    if write_kv:
        rows = c["req_to_token"][c["req_pool_indices"].long(), c["seq_lens"].long() - 1].long()
        new_kv = (c["k_cache"][rows].clone(), c["v_cache"][rows].clone(), rows)
        k_want, v_want = c["k_cache"].clone(), c["v_cache"].clone()
        c["k_cache"][rows], c["v_cache"][rows] = 30.0, -30.0   # stale entries: the step's token not yet stored
    dec = LocksDecode(cfg, _workspace(), hkv * group, hkv, 128, bsz)
    dec.plan(c["seq_lens"].cpu(), torch.bfloat16, torch.bfloat16)
    out = dec.run(q, c["k_cache"], c["v_cache"], c["summaries"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"],
                  new_kv)
    assert _rel(out, ref) < 1e-2
    if write_kv:
        assert torch.equal(c["k_cache"], k_want) and torch.equal(c["v_cache"], v_want)


@pytest.mark.parametrize("kernel", SPARSE_DECODE_KERNELS)
def test_cuda_graph_replay_follows_new_inputs(kernel):
    seq_lens, hkv, group = [16 * 400 + 3, 16 * 90], 8, 4
    c = random_cache(seq_lens, hkv, 128, device="cuda", seed=2)
    cfg = LocksConfig(token_budget=512, prefilter=8, sparse_decode=kernel)  # the prefilter's launches in the graph too: 256 of 400 pages
    dec = LocksDecode(cfg, _workspace(), hkv * group, hkv, 128, 2, use_cuda_graph=True)
    dec.plan(c["seq_lens"].cpu(), torch.bfloat16, torch.bfloat16)
    q = torch.randn(2, hkv * group, 128, device="cuda", dtype=torch.bfloat16)
    args = (c["k_cache"], c["v_cache"], c["summaries"], c["req_to_token"], c["req_pool_indices"], c["seq_lens"])
    dec.run(q, *args)  # warm up (compiles)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dec.run(q, *args)
    for _ in range(2):
        q.copy_(torch.randn_like(q))
        graph.replay()
        eager = dec.run(q.clone(), *args)
        assert torch.equal(out, eager)
        indptr, last_page_len = selected_pages(c["seq_lens"].cpu(), hkv, cfg.budget_pages)
        ref = sparse_decode_reference(q, c["k_cache"], c["v_cache"], indptr, dec.sparse.indices[: int(indptr[-1])],
                                      last_page_len, hkv, 128**-0.5)
        assert _rel(out, ref) < 1e-2


@pytest.mark.parametrize("hkv, group", [(8, 4), (2, 16)])
def test_cuda_graph_of_chained_layers_equals_serial_launches(hkv, group):
    """Layers whose query is the output of the layer before, in one CUDA graph with programmatic dependent
    launch of every kernel of the chain (kernels/_triton.dependent_launch; by default the score kernel's at up to
    8 query heads per KV head and the sparse decode's): each must wait for the one before it (the scores, whose
    programs read the page table and summaries before they wait, for the last layer's merge before they read q;
    the selection for the scores, the sparse decode for the selection), so the graph gives what launches without
    it give, bit for bit; so must each layer's selection, which writes the layer's key and value that its
    sparse decode reads.
    Without the waits it fails (checked once by removing them)."""
    c = random_cache([16 * 300 + 7, 16 * 45 + 3], hkv, 128, device="cuda", seed=5)
    dec = LocksDecode(LocksConfig(token_budget=512), _workspace(), hkv * group, hkv, 128, 2, use_cuda_graph=True)
    dec.plan(c["seq_lens"].cpu(), torch.bfloat16, torch.bfloat16)
    tables = (c["req_to_token"], c["req_pool_indices"], c["seq_lens"])
    qs = [torch.randn(2, hkv * group, 128, device="cuda", dtype=torch.bfloat16) for _ in range(7)]
    # Each layer writes its step's key and value (from the layer before's output) at each request's last slot
    # in the selection, over a stale entry, and its sparse decode must read them.
    last = c["req_to_token"][c["req_pool_indices"].long(), c["seq_lens"].long() - 1].long()

    def chain():
        c["k_cache"].index_fill_(0, last, 30.0)  # (a scalar fill: no host copy inside the graph's capture)
        c["v_cache"].index_fill_(0, last, -30.0)
        for layer in range(len(qs) - 1):
            write = CacheWrite(qs[layer][:, :hkv], qs[layer][:, hkv : 2 * hkv], c["k_cache"], c["v_cache"], last)
            dec.select(qs[layer], c["summaries"], *tables, cache_write=write)
            dec.sparse.run(qs[layer], c["k_cache"], c["v_cache"], out=qs[layer + 1])

    with dependent_kernels(CHAIN_KERNELS):
        chain()  # compiles
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            chain()
    for _ in range(3):
        qs[0].copy_(torch.randn_like(qs[0]))
        graph.replay()
        replayed = torch.stack(qs[1:])
        with dependent_kernels(()):
            chain()
        assert torch.equal(replayed, torch.stack(qs[1:]))
        assert not dec.selection_state.mass.any()


@pytest.mark.parametrize("kernel", SPARSE_DECODE_KERNELS)
def test_cuda_graph_steps_replan_only_when_pages_change(kernel, monkeypatch):
    """Decode steps of growing requests under one captured graph: the sparse decode plans again only
    when a row's page count changes (the last page's length is read from the buffer), and every step
    attends what the reference does."""
    hkv, group, steps = 4, 4, 5
    base = [16 * 300 + 13, 16 * 20 + 14]  # over the budget (its page count is fixed), under it (grows)
    c = random_cache([n + steps for n in base], hkv, 128, device="cuda", seed=4)
    start = c["seq_lens"].cpu() - steps  # the cache's (shuffled) order
    cfg = LocksConfig(token_budget=512, sparse_decode=kernel)
    dec = LocksDecode(cfg, _workspace(), hkv * group, hkv, 128, 2, use_cuda_graph=True)
    plans = []
    if kernel == "flashinfer":
        flashinfer_plan = dec.sparse.wrapper.plan
        dec.sparse.wrapper.plan = lambda *a, **k: plans.append(1) or flashinfer_plan(*a, **k)
    else:
        import sglang_locks.sparse_decode as sd

        launch = sd.attend_launch
        monkeypatch.setattr(sd, "attend_launch", lambda *a: plans.append(1) or launch(*a))
    seq_lens = start.to("cuda", torch.int32)
    q = torch.randn(2, hkv * group, 128, device="cuda", dtype=torch.bfloat16)
    max_pages = int(c["seq_lens"].max()) // 16
    args = (c["k_cache"], c["v_cache"], c["summaries"], c["req_to_token"], c["req_pool_indices"], seq_lens)
    dec.plan(start, torch.bfloat16, torch.bfloat16, max_pages=max_pages)
    dec.run(q, *args)  # warm up (compiles)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dec.run(q, *args)
    for t in range(steps):
        lens = start + t
        dec.plan(lens, torch.bfloat16, torch.bfloat16, max_pages=max_pages)
        seq_lens.copy_(lens)
        q.copy_(torch.randn_like(q))
        graph.replay()
        indptr, last_page_len = selected_pages(lens, hkv, cfg.budget_pages)
        ref = sparse_decode_reference(q, c["k_cache"], c["v_cache"], indptr, dec.sparse.indices[: int(indptr[-1])],
                                      last_page_len, hkv, 128**-0.5)
        assert _rel(out, ref) < 1e-2, t
    # Pages per row (the request over / under the budget of 32 pages), before the loop and at t = 0..4:
    # 33/21, then 33/21, 33/21, 33/21 (16 * 21: no tail), 32/22, 33/22 -> plans before it, at t = 3 and 4.
    assert len(plans) == 3
