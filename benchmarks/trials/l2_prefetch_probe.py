"""H200 trial: prefetch the next layer's page summaries into L2 while this layer's selection and sparse decode run.

Scoring reads every page's summary from HBM (bandwidth-bound), while the selection and the sparse decode that
follow it are latency-bound and leave HBM idle. A kernel on a side stream, forked after a layer's score launch and
joined before the next one's, issues bulk L2 prefetches (cp.async.bulk.prefetch.L2) of the first `frac` of each
score program's span of the next layer's summaries. Timed as whole decode steps (every layer's score, select and
attend in one CUDA graph, medians), against the same chain without prefetch:

  attn       the attention part alone (what attention_decode.py measures)
  mlp        + a 200 MB device copy between layers, standing in for the weights a real layer streams through L2
             (o_proj, MLP, next qkv); with evict_last prefetches, and with L2 set aside for persisting lines
             (cudaLimitPersistingL2CacheSize), which normal accesses cannot evict

    OUT=DIR python benchmarks/trials/l2_prefetch_probe.py

Result (H200, results/l2_prefetch_probe_s18.json): slower in every form (Llama-3.1-8B 128K 36.2 us per layer
without, 40.1-58.5 with; GLM-4-9B-1M 1M 65.2 without, 83.5-125.6 with); not pursued.
"""
import ctypes
import glob
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from attention_decode import SHAPES, graph_ms, random_summaries  # noqa: E402
from sglang_locks.config import LocksConfig  # noqa: E402
from sglang_locks.decode import LocksDecode  # noqa: E402
from sglang_locks.kernels.selected_indices import selected_indices_triton  # noqa: E402
from sglang_locks.scoring import locks_scores_triton  # noqa: E402

_PF = tl.constexpr("cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;")
_PF_LAST = tl.constexpr("{ .reg .b64 pol; createpolicy.fractional.L2::evict_last.b64 pol, 1.0; "
                        "cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], $2, pol; mov.u32 $0, 0; }")


@triton.jit
def _pf(base, page, nbytes: tl.constexpr, LAST: tl.constexpr):
    off = page.to(tl.int64) * nbytes
    if nbytes < 16:  # a 16-byte window (bulk prefetches are whole 16-byte units) holding the page's bytes
        size = tl.full(page.shape, 16, tl.int32)
        off = off // 16 * 16
    else:
        size = tl.full(page.shape, nbytes, tl.int32)
    ptr = base + off
    if LAST:
        return tl.inline_asm_elementwise(_PF_LAST, "=r,l,r", [ptr, size], dtype=tl.int32, is_pure=False, pack=1)
    return tl.inline_asm_elementwise(_PF, "=r,l,r", [ptr, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_kernel(mu, mu_s, basis, coef, coef_s, req_to_token, stride_rt, req_pool, seq_lens, n_chunks, frac_1024,
                     sink, MU_B: tl.constexpr, MUS_B: tl.constexpr, BASIS_B: tl.constexpr, COEF_B: tl.constexpr,
                     COEFS_B: tl.constexpr, LAST: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    c = tl.program_id(1)
    n = tl.load(seq_lens + b) // 16
    span = tl.cdiv(tl.cdiv(n, n_chunks), 16) * 16
    start = c * span
    end = tl.minimum(start + span * frac_1024 // 1024, n)
    table = req_to_token + tl.load(req_pool + b).to(tl.int64) * stride_rt
    acc = tl.zeros((BLOCK,), tl.int32)
    for p0 in range(start, end, BLOCK):
        p = p0 + tl.arange(0, BLOCK)
        page = tl.load(table + p * 16, mask=p < end, other=0) // 16
        acc += _pf(basis, page, BASIS_B, LAST)
        acc += _pf(mu, page, MU_B, LAST)
        acc += _pf(coef, page, COEF_B, LAST)
        acc += _pf(coef_s, page, COEFS_B, LAST)
        acc += _pf(mu_s, page, MUS_B, LAST)
    tl.store(sink + tl.arange(0, BLOCK), acc, mask=acc == 12345)  # keeps the asm (never true)


def per_page(t):
    return t[0].numel() * t.element_size()


def prefetch(s, tables, n_chunks, frac, last, sink):
    req_to_token, req_pool, seq_lens = tables
    _prefetch_kernel[(seq_lens.numel(), n_chunks)](
        s.mu, s.mu_scale, s.basis, s.coef, s.coef_scale, req_to_token, req_to_token.stride(0), req_pool, seq_lens,
        n_chunks, int(frac * 1024), sink, MU_B=per_page(s.mu), MUS_B=per_page(s.mu_scale), BASIS_B=per_page(s.basis),
        COEF_B=per_page(s.coef), COEFS_B=per_page(s.coef_scale), LAST=last, BLOCK=64, num_warps=2)


def cudart():
    import nvidia
    for root in list(nvidia.__path__):
        for path in glob.glob(os.path.join(root, "**", "libcudart.so*"), recursive=True):
            return ctypes.CDLL(path)
    return ctypes.CDLL("libcudart.so")


def set_persisting(nbytes):
    rt = cudart()
    err = rt.cudaDeviceSetLimit(ctypes.c_int(0x06), ctypes.c_size_t(nbytes))  # cudaLimitPersistingL2CacheSize
    got = ctypes.c_size_t(0)
    rt.cudaDeviceGetLimit(ctypes.byref(got), ctypes.c_int(0x06))
    return int(err), int(got.value)


def run_shape(shape, context, reps, rows):
    layers, hkv, hq, d = SHAPES[shape]
    cfg = LocksConfig()
    slots = context + 16
    ks = [torch.randn(slots, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
    vs = [torch.randn_like(k) for k in ks]
    sums = [random_summaries(slots // 16, hkv, d, cfg.rank) for _ in range(layers)]
    tables = (torch.arange(context, device="cuda", dtype=torch.int32).view(1, context) + 16,
              torch.zeros(1, device="cuda", dtype=torch.int32),
              torch.full((1,), context, device="cuda", dtype=torch.int32))
    q = torch.randn(1, hq, d, device="cuda", dtype=torch.bfloat16)
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    dec = LocksDecode(cfg, ws, hq, hkv, d, 1, use_cuda_graph=True)
    dec.plan(tables[2].cpu(), torch.bfloat16, torch.bfloat16, d ** -0.5)
    n_chunks = locks_scores_triton(q, sums[0], *tables, dec.max_pages, dec.sm_scale, cfg, dec.selection_state,
                                   dec.candidates)[1].shape[-1]
    sink = torch.zeros(64, dtype=torch.int32, device="cuda")
    mlp_src = torch.empty(200 << 20, dtype=torch.uint8, device="cuda")
    mlp_dst = torch.empty_like(mlp_src)
    side = torch.cuda.Stream()
    sp = dec.sparse

    def step(frac=0.0, last=False, mlp=False):
        main = torch.cuda.current_stream()
        for i in range(layers):
            *scored, cand, mass = locks_scores_triton(q, sums[i], *tables, dec.max_pages, dec.sm_scale, cfg,
                                                      dec.selection_state, dec.candidates)
            if frac and i + 1 < layers:
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    prefetch(sums[i + 1], tables, n_chunks, frac, last, sink)
            selected_indices_triton(*scored, *tables, sp.indptr, sp.indices, sp.last_page_len, hkv, cfg.sink_pages,
                                    cfg.local_pages, cfg.gqa_aggregation, cfg.budget_pages, dec.selection_state, cand,
                                    mass=mass)
            sp.run(q, ks[i], vs[i])
            if mlp:
                mlp_dst.copy_(mlp_src)
            if frac and i + 1 < layers:
                main.wait_stream(side)

    # outputs equal with and without prefetch (prefetch is a hint)
    step()
    torch.cuda.synchronize()
    ref = sp.indices.clone()
    step(0.5, True)
    torch.cuda.synchronize()
    equal = bool(torch.equal(ref, sp.indices))
    variants = [("attn", 0.0, False, False)] + [(f"attn+pf{f}", f, False, False) for f in (0.25, 0.5, 0.75, 1.0)]
    variants += [(f"attn+pf{f}_last", f, True, False) for f in (0.5, 1.0)]
    variants += [("mlp", 0.0, False, True), ("mlp+pf0.5", 0.5, False, True), ("mlp+pf0.5_last", 0.5, True, True)]
    for rep in range(2):
        for name, frac, last, mlp in variants:
            ms = graph_ms(lambda: step(frac, last, mlp), reps)
            rows.append(dict(shape=shape, context=context, variant=name, rep=rep, ms=round(ms, 4),
                             us_per_layer=round(ms * 1e3 / layers, 2), outputs_equal=equal, n_chunks=n_chunks))
            print(rows[-1], flush=True)
    try:
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        for frac_l2 in (0.5, 0.75):
            err, got = set_persisting(int(l2 * frac_l2))
            for name, frac, last, mlp in (("mlp", 0.0, False, True), ("mlp+pf0.5_last", 0.5, True, True),
                                          ("mlp+pf0.25_last", 0.25, True, True), ("attn+pf0.5_last", 0.5, True, False)):
                ms = graph_ms(lambda: step(frac, last, mlp), reps)
                rows.append(dict(shape=shape, context=context, variant=f"{name}+persist{frac_l2}", persist_err=err,
                                 persist_bytes=got, ms=round(ms, 4), us_per_layer=round(ms * 1e3 / layers, 2)))
                print(rows[-1], flush=True)
        set_persisting(0)
    except Exception as e:  # noqa: BLE001 - a probe: record why the persisting variant did not run
        rows.append(dict(shape=shape, persist_error=repr(e)))
        print(rows[-1], flush=True)


def main():
    out = os.environ.get("OUT", ".")
    rows = []
    header = dict(gpu=torch.cuda.get_device_name(), git=os.environ.get("GIT_REV"), date=os.environ.get("DATE"),
                  command="OUT=DIR python benchmarks/trials/l2_prefetch_probe.py",
                  l2_bytes=torch.cuda.get_device_properties(0).L2_cache_size)
    for shape, context in (("llama3.1-8b", 131072), ("glm4-9b-1m", 1048576)):
        run_shape(shape, context, 30, rows)
        json.dump(dict(header, rows=rows), open(os.path.join(out, "l2_prefetch_probe.json"), "w"), indent=1)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
