"""H200: is the score kernel bound by its memory access pattern? One layer, bs=1, CUDA-graph medians of 20 launches:
the score kernel against a plain contiguous read of the same bytes (`read`) and kernels that only copy the
summaries into shared memory as b0d716d's score kernels did (same programs, steps, cp.async stages, no arithmetic;
8 pages an instruction, 64 bytes of each), for four layouts of the same bytes:

    split      PageSummaries: five tensors (basis, coef, mu, coef_scale, mu_scale), record page * H + h
    split_hm   the five tensors head-major: record h * pages + page (each program streams contiguous bytes)
    packed     one 832-byte record per (page, KV head) holding all five, record page * H + h
    packed_hm  the packed records head-major

and, on split, whole pages an instruction (`wide`), 3 stages (`s3`) and 16-page steps (`bp16`).

    OUT=DIR python research/summary_layout_probe.py   (from the repository root; writes DIR/summary_layout_probe.json)
"""
import json
import os
import sys

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

sys.path.insert(0, "benchmarks")
sys.path.insert(0, "research")
from attention_decode import copy_bandwidth_gbs, graph_ms, score_launched_alone  # noqa: E402
from probe_inputs import score_inputs  # noqa: E402
from sglang_locks.kernels.score_pages import score_chunks  # noqa: E402
from sglang_locks.kernels.score_pages_gluon import (STEP_PAIRS, SMEM_STAGES, _idx2, _idx3, _row_span,  # noqa: E402
                                                    _stage_buffers, score_pages_gluon)
from sglang_locks.kernels.score_pages_gluon_heads import score_pages_gluon_heads  # noqa: E402

REC = 832  # packed record bytes: basis 512, coef 128, mu 128, coef_scale 32, mu_scale 4, padding 28


@gluon.constexpr_function
def _copy_layout(BP, num_warps, rank, vec, rows_over_threads=False):
    """The score kernels' copy layouts before this probe (b0d716d): each thread copies vec elements of one page,
    pages over (warp, thread // TP); a page's TP threads split its row (rank 3: its rows, with rows_over_threads)."""
    BP, num_warps, rank, vec = (getattr(x, "value", x) for x in (BP, num_warps, rank, vec))
    ppw = BP // num_warps
    tp = 32 // ppw
    if rank == 3:
        threads = [ppw, tp, 1] if getattr(rows_over_threads, "value", rows_over_threads) else [ppw, 1, tp]
        return gl.BlockedLayout([1, 1, vec], threads, [num_warps, 1, 1], [2, 1, 0])
    return gl.BlockedLayout([1, vec], [ppw, tp], [num_warps, 1], [1, 0])


@gluon.jit
def _records(table, h, p, n_last, n_pages, HKV: gl.constexpr, PAGE: gl.constexpr, HEAD_MAJOR: gl.constexpr):
    page = gl.load(table + gl.minimum(p, n_last) * PAGE) // PAGE
    if HEAD_MAJOR:
        return h * n_pages + page
    else:
        return page * HKV + h


@gluon.jit
def _copy_step(smem_v, smem_c, smem_m, smem_s, smem_u, basis_ptr, coef_ptr, mu_ptr, cs_ptr, ms_ptr, rec,
               BP: gl.constexpr, D: gl.constexpr, PAGE: gl.constexpr, num_warps: gl.constexpr, PACKED: gl.constexpr,
               WIDE: gl.constexpr):
    """score_pages_gluon._stage_copy with each tensor's record stride and offset (elements of its own type)."""
    R: gl.constexpr = 8
    HALF: gl.constexpr = D // 2
    if PACKED:
        RV: gl.constexpr = 832
        RC: gl.constexpr = 832
        RM: gl.constexpr = 832
        RS: gl.constexpr = 208
        RU: gl.constexpr = 208
        OC: gl.constexpr = 512
        OM: gl.constexpr = 640
        OS: gl.constexpr = 192
        OU: gl.constexpr = 200
    else:
        RV: gl.constexpr = R * HALF
        RC: gl.constexpr = R * PAGE
        RM: gl.constexpr = D
        RS: gl.constexpr = R
        RU: gl.constexpr = 1
        OC: gl.constexpr = 0
        OM: gl.constexpr = 0
        OS: gl.constexpr = 0
        OU: gl.constexpr = 0
    if WIDE:
        # a page's basis (512 bytes) per warp instruction, coefficients and centroids 4 pages (128 bytes each)
        cpv: gl.constexpr = gl.BlockedLayout([1, 1, 16], [1, 8, 4], [num_warps, 1, 1], [2, 1, 0])
        cpc: gl.constexpr = gl.BlockedLayout([1, 1, 16], [4, 8, 1], [num_warps, 1, 1], [2, 1, 0])
        cpm: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
    else:
        cpv: gl.constexpr = _copy_layout(BP, num_warps, 3, 16)
        cpm: gl.constexpr = _copy_layout(BP, num_warps, 2, 16)
        cpc: gl.constexpr = _copy_layout(BP, num_warps, 3, 16, True)
    cps: gl.constexpr = _copy_layout(BP, num_warps, 2, 2)
    rec = gl.convert_layout(rec, gl.SliceLayout(1, gl.SliceLayout(2, cpv)))
    r3 = gl.expand_dims(gl.expand_dims(rec, 1), 2).to(gl.int64)
    _, i, k = _idx3(BP, R, HALF, cpv)
    async_copy.async_copy_global_to_shared(smem_v, basis_ptr + r3 * RV + i * HALF + k)
    rc = gl.expand_dims(gl.expand_dims(gl.convert_layout(rec, gl.SliceLayout(1, gl.SliceLayout(2, cpc))), 1), 2)
    _, i, k = _idx3(BP, R, PAGE, cpc)
    async_copy.async_copy_global_to_shared(smem_c, coef_ptr + rc.to(gl.int64) * RC + OC + i * PAGE + k)
    r2 = gl.expand_dims(gl.convert_layout(rec, gl.SliceLayout(1, cpm)), 1).to(gl.int64)
    _, mk = _idx2(BP, D, cpm)
    async_copy.async_copy_global_to_shared(smem_m.slice(0, BP, 0), mu_ptr + r2 * RM + OM + mk)
    rs = gl.convert_layout(rec, gl.SliceLayout(1, cps)).to(gl.int64)
    _, sk = _idx2(BP, R, cps)
    async_copy.async_copy_global_to_shared(smem_s, cs_ptr + gl.expand_dims(rs, 1) * RS + OS + sk)
    async_copy.async_copy_global_to_shared(smem_u.slice(0, BP, 0), ms_ptr + rs * RU + OU)
    async_copy.commit_group()


@gluon.jit
def _copy_only_kernel(basis_ptr, coef_ptr, mu_ptr, cs_ptr, ms_ptr, req_to_token_ptr, stride_rt, req_pool_ptr,
                      seq_lens_ptr, out_ptr, max_pages, n_chunks, n_pages,
                      HKV: gl.constexpr, D: gl.constexpr, PAGE: gl.constexpr, BP: gl.constexpr, STAGES: gl.constexpr,
                      PACKED: gl.constexpr, HEAD_MAJOR: gl.constexpr, WIDE: gl.constexpr, num_warps: gl.constexpr):
    MU_ROWS: gl.constexpr = 16 if BP < 16 else BP
    smem_v, smem_c, smem_m, smem_s, smem_u = _stage_buffers(STAGES, BP, MU_ROWS, D, PAGE)
    b, h, table, start, end, n_last, n_steps = _row_span(req_to_token_ptr, stride_rt, req_pool_ptr, seq_lens_ptr,
                                                         max_pages, n_chunks, BP, HKV, PAGE)
    cpv: gl.constexpr = _copy_layout(BP, num_warps, 3, 16)
    j = gl.arange(0, BP, layout=gl.SliceLayout(1, gl.SliceLayout(2, cpv)))
    for z in gl.static_range(STAGES - 1):
        _copy_step(smem_v.index(z), smem_c.index(z), smem_m.index(z), smem_s.index(z), smem_u.index(z),
                   basis_ptr, coef_ptr, mu_ptr, cs_ptr, ms_ptr,
                   _records(table, h, start + z * BP + j, n_last, n_pages, HKV, PAGE, HEAD_MAJOR),
                   BP, D, PAGE, num_warps, PACKED, WIDE)
    rec_next = _records(table, h, start + (STAGES - 1) * BP + j, n_last, n_pages, HKV, PAGE, HEAD_MAJOR)
    acc = gl.zeros([MU_ROWS], gl.float32, gl.BlockedLayout([1], [32], [num_warps], [0]))
    for it in range(n_steps):
        gl.thread_barrier()
        ns = ((it + STAGES - 1) % STAGES).to(gl.int32)
        _copy_step(smem_v.index(ns), smem_c.index(ns), smem_m.index(ns), smem_s.index(ns), smem_u.index(ns),
                   basis_ptr, coef_ptr, mu_ptr, cs_ptr, ms_ptr, rec_next, BP, D, PAGE, num_warps, PACKED, WIDE)
        rec_next = _records(table, h, start + (it + STAGES) * BP + j, n_last, n_pages, HKV, PAGE, HEAD_MAJOR)
        async_copy.wait_group(STAGES - 1)
        gl.thread_barrier()
        acc += smem_u.index((it % STAGES).to(gl.int32)).load(acc.type.layout)  # one read: the stage is used
    async_copy.wait_group(0)
    gl.store(out_ptr + gl.program_id(0) * n_chunks + gl.program_id(1), gl.sum(acc, 0))


def layouts(s, n_pages, hkv):
    """The four layouts' (basis, coef, mu, coef_scale, mu_scale) tensors of summaries s (same bytes)."""
    parts = (s.basis.view(n_pages, hkv, -1), s.coef.view(n_pages, hkv, -1).view(torch.uint8),
             s.mu.view(n_pages, hkv, -1).view(torch.uint8), s.coef_scale.view(torch.uint8),
             s.mu_scale.view(n_pages, hkv, 1).view(torch.uint8))
    split = (s.basis, s.coef, s.mu, s.coef_scale, s.mu_scale)
    split_hm = tuple(t.view(n_pages, hkv, -1).transpose(0, 1).contiguous() for t in split)
    packed = torch.zeros(n_pages, hkv, REC, dtype=torch.uint8, device="cuda")
    for part, (a, b) in zip(parts, ((0, 512), (512, 640), (640, 768), (768, 800), (800, 804))):
        packed[..., a:b] = part
    packed_hm = packed.transpose(0, 1).contiguous()

    def views(p):
        return (p, p.view(torch.int8), p.view(torch.int8), p.view(torch.float32), p.view(torch.float32))
    return {"split": (split, False, False), "split_hm": (split_hm, False, True),
            "packed": (views(packed), True, False), "packed_hm": (views(packed_hm), True, True)}


@triton.jit
def _read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Read-bandwidth reference: programs sum int32 words of a contiguous buffer, grid-stride."""
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.int32)
    for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        acc += tl.load(x_ptr + start + tl.arange(0, BLOCK), mask=start + tl.arange(0, BLOCK) < n, other=0)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


def main():
    out_dir = os.environ.get("OUT", "/tmp")
    copy = copy_bandwidth_gbs()
    rows = []
    for shape, context in (("glm4-9b-1m", 1048576), ("glm4-9b-1m", 262144), ("llama3.1-8b", 131072),
                           ("llama3.1-8b", 262144)):
        sums, tables, q, moved = score_inputs(shape, 1, context, 2)
        hkv = sums[0].num_kv_heads
        pages = context // 16
        n_pages = sums[0].num_pages
        heads = q.shape[1] // hkv == 16
        bp = 2 * STEP_PAIRS  # both kernels' steps at their launch defaults (1 warp)
        _, n_chunks = score_chunks(hkv, pages, q.device, bp)
        lays = [layouts(s, n_pages, hkv) for s in sums]
        times = {}

        def real(i):
            fn = score_pages_gluon_heads if heads else score_pages_gluon
            fn(q, sums[i % 2], *tables, pages, 128 ** -0.5)

        def copy_only(name):
            def run(i):
                t, packed, hm = lays[i % 2][name]
                _copy_only_kernel[(hkv, n_chunks)](*t, tables[0], tables[0].stride(0), tables[1], tables[2], outs,
                                                    pages, n_chunks, n_pages, HKV=hkv, D=128, PAGE=16, BP=bp,
                                                    STAGES=SMEM_STAGES, PACKED=packed, HEAD_MAJOR=hm, WIDE=False, num_warps=1)
            return run
        def real_stages(st):
            def run(i):
                fn = score_pages_gluon_heads if heads else score_pages_gluon
                fn(q, sums[i % 2], *tables, pages, 128 ** -0.5, stages=st)
            return run

        def copy_depth(stages, bp, per_sm=None, wide=False):
            chunks = n_chunks if per_sm is None else max(1, per_sm * 132 // hkv)
            def run(i):
                t, _, _ = lays[i % 2]["split"]
                _copy_only_kernel[(hkv, chunks)](*t, tables[0], tables[0].stride(0), tables[1], tables[2], outs,
                                                  pages, chunks, n_pages, HKV=hkv, D=128, PAGE=16, BP=bp,
                                                  STAGES=stages, PACKED=False, HEAD_MAJOR=False, WIDE=wide,
                                                  num_warps=1)
            return run
        words = [torch.randint(-2**31, 2**31 - 1, (moved // 4,), dtype=torch.int32, device="cuda") for _ in range(2)]
        red = torch.zeros(132 * 8, dtype=torch.int32, device="cuda")

        def read(i):
            _read_kernel[(132 * 8,)](words[i % 2], red, words[0].numel(), BLOCK=2048, num_warps=4)
        outs = torch.zeros(hkv * 16 * 132, device="cuda")
        fns = {"kernel": real, "read": read,
               **{f"copy_{n}": copy_only(n) for n in ("split", "split_hm", "packed", "packed_hm")},
               "copy_wide": copy_depth(2, 8, wide=True), "copy_wide_s3": copy_depth(3, 8, wide=True),
               "copy_wide_bp16": copy_depth(2, 16, wide=True), "copy_s3": copy_depth(3, 8),
               "copy_bp16": copy_depth(2, 16)}
        for _ in range(3):
            for name, fn in fns.items():
                def many(fn=fn):
                    for i in range(20):
                        fn(i)
                with score_launched_alone():
                    times.setdefault(name, []).append(graph_ms(many, 30) * 1e3 / 20)
        row = dict(shape=shape, batch=1, context=context, bytes=moved, copy_gbs=round(copy, 1),
                   us={k: round(sorted(v)[1], 2) for k, v in times.items()},
                   copy_fraction={k: round(moved / sorted(v)[1] / 1e3 / copy, 3) for k, v in times.items()})
        print(json.dumps(row), flush=True)
        rows.append(row)
        del sums, lays
        torch.cuda.empty_cache()
        json.dump({"gpu": torch.cuda.get_device_name(), "git": os.environ.get("GIT_REV", ""),
                   "command": "OUT=DIR python research/summary_layout_probe.py", "rows": rows},
                  open(os.path.join(out_dir, "summary_layout_probe.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
