"""Attention part of one decode step, all layers: FlashInfer dense decode vs LOCKS, on the GPU.

    python benchmarks/attention_decode.py --out benchmarks/results/attention_decode.json

Each step (every layer's attention) is captured in one CUDA graph and its
replays are timed with CUDA events (median of --reps). Score, select and
attend are also captured and timed alone (the score kernel without programmatic
dependent launch, see score_launched_alone). KV caches and summaries are random
(timing does not depend on values); where the cache of all layers does not
fit in memory, layers cycle over as many distinct per-layer buffers as fit
(each far larger than the 60 MB L2, so every layer still streams from HBM);
rows record how many.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import time

import torch


from sglang_locks.config import LocksConfig
from sglang_locks.decode import LocksDecode
from sglang_locks.kernels import _triton
from sglang_locks.kernels.score_pages import estimate_block_pages, score_chunks, score_pages_triton
from sglang_locks.kernels.page_selection import candidate_pages_triton, selected_indices_triton
from sglang_locks.scoring import locks_scores_triton, prefiltered
from sglang_locks.selection import selected_lengths
from sglang_locks.summaries import PageSummaries

SHAPES = {  # layers, KV heads, query heads, head_dim
    "llama3.1-8b": (32, 8, 32, 128),
    "glm4-9b-1m": (40, 2, 32, 128),
}
GIB = 1 << 30


def median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def graph_ms(step, reps: int) -> float:
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    ms = median_ms(graph.replay, reps)
    del graph
    return ms


def launch_us(fn, reps: int = 30, inner: int = 20) -> float:
    """Microseconds per launch of fn: CUDA-graph medians of inner launches (a lone launch would
    time the host's launch latency, not the kernel)."""
    def many():
        for _ in range(inner):
            fn()
    return graph_ms(many, reps) * 1e3 / inner


def copy_bandwidth_gbs(reps: int = 20) -> float:
    """Device-to-device copy, bytes read + written per second."""
    src = torch.randn(GIB // 2, device="cuda")  # 2 GiB
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), reps)
    return 2 * src.numel() * 4 / ms / 1e6


def random_summaries(num_pages, hkv, d, rank):
    s = PageSummaries.allocate(num_pages, hkv, d, rank, "int8-int4-int8", "cuda")
    s.mu.random_(-127, 128)
    s.basis.random_(0, 256)
    s.coef.random_(-127, 128)
    s.mu_scale.uniform_(0.01, 0.05)
    s.coef_scale.uniform_(0.001, 0.01)
    return s


ONE_LAYER_CONTEXTS = {"llama3.1-8b": 131072, "glm4-9b-1m": 1048576}


def one_layer_inputs(shape: str, context: int = None):
    """The score kernel's inputs for one layer of one request (bs=1) on sequential pages, random
    summaries: (q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale), and
    the bytes the kernel must move (summaries, page ids, scores written)."""
    context = context or ONE_LAYER_CONTEXTS[shape]
    _, hkv, hq, d = SHAPES[shape]
    summaries = random_summaries(context // 16 + 1, hkv, d, LocksConfig().rank)
    req_to_token = (torch.arange(context, device="cuda", dtype=torch.int32) + 16).view(1, context)
    req_pool = torch.zeros(1, device="cuda", dtype=torch.int32)
    seq_lens = torch.full((1,), context, device="cuda", dtype=torch.int32)
    q = torch.randn(1, hq, d, device="cuda", dtype=torch.bfloat16)
    pages = context // 16
    moved = hkv * pages * summaries.bytes_per_page_per_head() + pages * 4 * (1 + hq)
    return (q, summaries, req_to_token, req_pool, seq_lens, pages, d**-0.5), moved


def bench_case(shape, bsz, context, budget, reps, kv_cap_gib, sum_cap_gib, prefilters=(0,), prefilter_rank=0):
    """One row per prefilter setting, all against the same dense measurement."""
    layers, hkv, hq, d = SHAPES[shape]
    slots = bsz * context + 16  # page 0 stays unused, as in SGLang
    kv_layer_bytes = slots * hkv * d * 2 * 2
    n_kv = max(1, min(layers, int(kv_cap_gib * GIB // kv_layer_bytes)))
    base = LocksConfig(token_budget=budget)
    num_pages = slots // 16
    probe = PageSummaries.allocate(1, 1, d, base.rank, base.summary_precision)
    sum_layer_bytes = num_pages * hkv * probe.bytes_per_page_per_head()
    n_sum = max(1, min(layers, int(sum_cap_gib * GIB // sum_layer_bytes)))
    if n_kv * kv_layer_bytes > 125 * GIB:
        return []
    ks = [torch.empty(slots, hkv, d, device="cuda", dtype=torch.bfloat16).normal_() for _ in range(n_kv)]
    vs = [torch.empty(slots, hkv, d, device="cuda", dtype=torch.bfloat16).normal_() for _ in range(n_kv)]
    sums = [random_summaries(num_pages, hkv, d, base.rank) for _ in range(n_sum)]
    req_to_token = (torch.arange(bsz * context, device="cuda", dtype=torch.int32) + 16).view(bsz, context)
    req_pool = torch.arange(bsz, device="cuda", dtype=torch.int32)
    seq_lens_cpu = torch.full((bsz,), context, dtype=torch.int32)
    seq_lens = seq_lens_cpu.cuda()
    q = torch.randn(bsz, hq, d, device="cuda", dtype=torch.bfloat16)
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    sm_scale = d**-0.5

    from flashinfer import BatchDecodeWithPagedKVCacheWrapper

    dense = {}
    indptr = torch.arange(bsz + 1, dtype=torch.int32) * context
    for tc in (True, False) if hq // hkv <= 8 else (True,):
        w = BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_cuda_graph=True, use_tensor_cores=tc,
            paged_kv_indptr_buffer=torch.empty(bsz + 1, dtype=torch.int32, device="cuda"),
            paged_kv_indices_buffer=torch.empty(bsz * context, dtype=torch.int32, device="cuda"),
            paged_kv_last_page_len_buffer=torch.empty(bsz, dtype=torch.int32, device="cuda"),
        )
        w.plan(indptr, req_to_token.reshape(-1), torch.ones(bsz, dtype=torch.int32), hq, hkv, d, 1,
               q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=sm_scale)
        out = torch.empty_like(q)

        def dense_step(w=w, out=out):
            for layer in range(layers):
                i = layer % n_kv
                w.run(q, (ks[i].view(-1, 1, hkv, d), vs[i].view(-1, 1, hkv, d)), out=out)

        dense["tc" if tc else "cuda_cores"] = graph_ms(dense_step, reps)
    dense_ms = min(dense.values())
    tables = (req_to_token, req_pool, seq_lens)
    n_sealed = context // 16
    selected_tokens = int(selected_lengths(seq_lens_cpu, hkv, base.budget_pages).sum())
    rows = []
    for prefilter in prefilters:
        cfg = dataclasses.replace(base, prefilter=prefilter, prefilter_rank=prefilter_rank)
        dec = LocksDecode(cfg, workspace, hq, hkv, d, bsz, use_cuda_graph=True)
        dec.plan(seq_lens_cpu, torch.bfloat16, torch.bfloat16, sm_scale)
        forced = (cfg.sink_pages, cfg.local_pages, cfg.gqa_aggregation)

        def locks_step():
            for layer in range(layers):
                dec.run(q, ks[layer % n_kv], vs[layer % n_kv], sums[layer % n_sum], *tables)

        def score_step():  # prefiltered: the centroid launch, the candidates' selection and their full scores
            for layer in range(layers):
                locks_scores_triton(q, sums[layer % n_sum], *tables, dec.max_pages, sm_scale, cfg,
                                    dec.selection_state, dec.candidates)

        def attend_step():
            for layer in range(layers):
                dec.sparse.run(q, ks[layer % n_kv], vs[layer % n_kv])

        locks_ms = graph_ms(locks_step, reps)
        with score_launched_alone():
            score_ms = graph_ms(score_step, reps)
        # One score launch for the selection to rank; its masses (where the score kernel adds them up for the
        # selection, which clears them) restored before each selection, and the restoring's time taken off.
        dec.selection_state.mass.zero_()
        scored = locks_scores_triton(q, sums[0], *tables, dec.max_pages, sm_scale, cfg, dec.selection_state,
                                     dec.candidates)
        mass = scored.mass
        step_mass = None if mass is None else mass.clone()

        def restore_mass():
            if mass is not None:
                mass.copy_(step_mass)

        def restore_step():
            for _ in range(layers):
                restore_mass()

        def select_step():  # aggregate, page keys, radix top-k and page entries: one kernel
            for _ in range(layers):
                restore_mass()
                sparse = dec.sparse
                selected_indices_triton(scored, *tables, sparse.indptr, sparse.indices, sparse.last_page_len, hkv,
                                        *forced, cfg.budget_pages, dec.selection_state)

        select_ms = graph_ms(select_step, reps) - (0.0 if mass is None else graph_ms(restore_step, reps))
        attend_ms = graph_ms(attend_step, reps)
        prefilter_ms = {}
        if prefiltered(cfg, dec.max_pages):
            prefilter_ms = prefilter_split_ms(q, sums, n_sum, tables, dec, cfg, layers, reps)

        # Bytes the scoring must read: every page's summary, or (prefiltered) every page's centroid and
        # first prefilter_rank ranks and the candidates' whole summaries; page ids (or candidate slots).
        full_pages = min(n_sealed, cfg.candidate_pages) if prefiltered(cfg, dec.max_pages) else n_sealed
        estimate_bytes = 0
        if prefiltered(cfg, dec.max_pages):
            estimate_bytes = layers * bsz * hkv * n_sealed * probe.estimate_bytes_per_page_per_head(cfg.prefilter_rank)
        summary_bytes = estimate_bytes + layers * bsz * hkv * full_pages * probe.bytes_per_page_per_head()
        page_id_bytes = layers * bsz * (n_sealed + (hkv * full_pages if estimate_bytes else 0)) * 4
        score_io_bytes = layers * bsz * n_sealed * 4 * (2 * hq + 2 * hkv)  # scores written, read; keys written, read
        selected_kv_bytes = layers * selected_tokens * d * 2 * 2
        index_bytes = layers * selected_tokens * 4 * 2
        bytes_dense = layers * bsz * context * hkv * d * 2 * 2
        bytes_locks = summary_bytes + page_id_bytes + selected_kv_bytes + index_bytes
        rows.append({
            "shape": shape, "batch": bsz, "context": context, "budget": budget, "prefilter": prefilter,
            "prefilter_rank": prefilter_rank,
            "dense_ms": dense_ms, "dense_ms_by_kernel": dense, "locks_ms": locks_ms, "speedup": dense_ms / locks_ms,
            "score_ms": score_ms, "select_ms": select_ms, "attend_ms": attend_ms, "prefilter_split_ms": prefilter_ms,
            "score_gbs": (summary_bytes + page_id_bytes) / score_ms / 1e6,
            "bytes_dense": bytes_dense, "bytes_locks": bytes_locks,
            "bytes_locks_parts": {"summaries": summary_bytes, "estimates": estimate_bytes, "page_ids": page_id_bytes,
                                  "selected_kv": selected_kv_bytes, "indices": index_bytes,
                                  "score_intermediates": score_io_bytes},
            "distinct_kv_layers": n_kv, "distinct_summary_layers": n_sum,
        })
    return rows


def score_launched_alone():
    """The score kernels without programmatic dependent launch: launched back to back, each layer's programs
    would start beside the last layer's, which the decode step, whose score kernel follows a short merge, does not
    see (Llama-3.1-8B 128K bs=1: 0.667 against 0.574 ms a step, docs/performance.md)."""
    return _triton.dependent_kernels(tuple(k for k in _triton.DEPENDENT_KERNELS if not k.startswith("score")))


def prefilter_split_ms(q, sums, n_sum, tables, dec, cfg, layers, reps) -> dict:
    """The prefiltered scoring's three launches, each timed alone over all layers."""
    bsz, hq, _ = q.shape
    hkv = sums[0].num_kv_heads
    rows = bsz * hkv
    cand = dec.candidates
    n_estimate = score_chunks(rows, dec.max_pages, q.device, estimate_block_pages(cfg.prefilter_rank))[1]
    scores = torch.empty(bsz, hq, dec.max_pages, device="cuda")
    pm = torch.empty(bsz, hq, n_estimate, device="cuda")
    ps = torch.empty_like(pm)
    args = (*tables, dec.max_pages, dec.sm_scale)
    forced = (cfg.sink_pages, cfg.local_pages, cfg.gqa_aggregation)

    def estimate():
        for layer in range(layers):
            score_pages_triton(q, sums[layer % n_sum], *args, terms="estimate", estimate_rank=cfg.prefilter_rank,
                               out=(scores, pm, ps, 0))

    def candidates():
        for _ in range(layers):
            candidate_pages_triton(scores, pm, ps, n_estimate, *tables, cand, hkv, *forced, dec.selection_state)

    def full():
        for layer in range(layers):
            score_pages_triton(q, sums[layer % n_sum], *args, terms="candidates", candidates=cand, estimates=scores)

    return {name: graph_ms(f, reps) for name, f in (("estimate", estimate), ("candidate_select", candidates),
                                                     ("candidate_score", full))}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="llama3.1-8b,glm4-9b-1m")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--contexts", default="32768,131072,262144,1048576")
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--prefilters", default="0,8",
                    help="LOCKS rows per case: each --locks-prefilter value (0: every page scored in full)")
    ap.add_argument("--prefilter-rank", type=int, default=LocksConfig().prefilter_rank,
                    help="--locks-prefilter-rank of the prefiltered rows")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--kv-cap-gib", type=float, default=64)
    ap.add_argument("--summary-cap-gib", type=float, default=24)
    ap.add_argument("--max-kv-tokens", type=int, default=4 << 20, help="skip cases with more tokens in the batch")
    ap.add_argument("--time-limit", type=float, default=400, help="seconds; later cases are skipped")
    args = ap.parse_args()
    prefilters = [int(x) for x in args.prefilters.split(",") if x]
    t0 = time.time()
    # GIT_REV first: the device machine's copy of the checkout can carry stale git metadata.
    git = os.environ.get("GIT_REV") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                      text=True).stdout.strip()
    header = {
        "gpu": torch.cuda.get_device_name(), "git": git or "unknown",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python"] + sys.argv), "torch": torch.__version__,
        "copy_bandwidth_gbs": copy_bandwidth_gbs(),
    }
    rows, skipped = [], []
    for shape in args.shapes.split(","):
        for bsz in map(int, args.batches.split(",")):
            for ctx in map(int, args.contexts.split(",")):
                case = f"{shape} bs={bsz} N={ctx}"
                if bsz * ctx > args.max_kv_tokens or time.time() - t0 > args.time_limit:
                    skipped.append(case)
                    continue
                case_rows = bench_case(shape, bsz, ctx, args.budget, args.reps, args.kv_cap_gib, args.summary_cap_gib,
                                       prefilters, args.prefilter_rank)
                torch.cuda.empty_cache()  # the case's buffers, freed on return
                if not case_rows:
                    skipped.append(case)
                    continue
                for row in case_rows:
                    row["floor_dense_ms"] = row["bytes_dense"] / header["copy_bandwidth_gbs"] / 1e6
                    row["floor_locks_ms"] = row["bytes_locks"] / header["copy_bandwidth_gbs"] / 1e6
                    row["score_copy_fraction"] = row["score_gbs"] / header["copy_bandwidth_gbs"]
                    rows.append(row)
                    print(f"{case} prefilter={row['prefilter']}: dense {row['dense_ms']:.3f} ms, "
                          f"locks {row['locks_ms']:.3f} ms (score {row['score_ms']:.3f} "
                          f"{ {k: round(v, 3) for k, v in row['prefilter_split_ms'].items()} }, "
                          f"select {row['select_ms']:.3f}, attend {row['attend_ms']:.3f}) speedup {row['speedup']:.2f}x, "
                          f"score at {row['score_copy_fraction']:.0%} of copy bandwidth, "
                          f"floor ratio {row['floor_dense_ms'] / row['floor_locks_ms']:.1f}x", flush=True)
                with open(args.out, "w") as f:
                    json.dump({**header, "rows": rows, "skipped": skipped}, f, indent=1)
    with open(args.out, "w") as f:
        json.dump({**header, "rows": rows, "skipped": skipped}, f, indent=1)


if __name__ == "__main__":
    main()
