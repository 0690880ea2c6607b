"""Gluon helpers the score kernels share (score_pages_gluon.py, score_pages_gluon_heads.py): int4 and int8
unpacking, index grids, the cp.async pipeline that stages each step's page summaries in shared memory, and
the stores of scores and chunk partials."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from .score_pages import INT4_TO_INT8X16_PTX, INT8_TO_F16_PTX

# One warp per program, 4 page pairs per step, two shared-memory stages: the fastest on the H200 of 1-4 warps,
# 2-8 pairs, 2-3 stages and chunks of 32-128 pages.
STEP_PAIRS = 4
SMEM_STAGES = 2

_LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _unpack_int4_x16(x):
    return gl.inline_asm_elementwise(asm=INT4_TO_INT8X16_PTX, constraints="=r,=r,r", args=[x],
                                     dtype=(gl.int8, gl.int8), is_pure=True, pack=4)


@gluon.jit
def _int8_to_f16(x):
    return gl.inline_asm_elementwise(asm=INT8_TO_F16_PTX, constraints="=r,=r,r", args=[x], dtype=gl.float16,
                                     is_pure=True, pack=4)


@gluon.jit
def _lg2(x):
    return gl.inline_asm_elementwise(asm="lg2.approx.ftz.f32 $0, $1;", constraints="=r,r", args=[x],
                                     dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _pdl_start(PDL: gl.constexpr):
    """_triton.pdl_start in Gluon."""
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def _idx3(N0: gl.constexpr, N1: gl.constexpr, N2: gl.constexpr, layout: gl.constexpr):
    i0 = gl.arange(0, N0, layout=gl.SliceLayout(1, gl.SliceLayout(2, layout)))
    i1 = gl.arange(0, N1, layout=gl.SliceLayout(0, gl.SliceLayout(2, layout)))
    i2 = gl.arange(0, N2, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))
    return (gl.expand_dims(gl.expand_dims(i0, 1), 2), gl.expand_dims(gl.expand_dims(i1, 0), 2),
            gl.expand_dims(gl.expand_dims(i2, 0), 1))


@gluon.jit
def _idx2(N0: gl.constexpr, N1: gl.constexpr, layout: gl.constexpr):
    i0 = gl.arange(0, N0, layout=gl.SliceLayout(1, layout))
    i1 = gl.arange(0, N1, layout=gl.SliceLayout(0, layout))
    return gl.expand_dims(i0, 1), gl.expand_dims(i1, 0)


@gluon.jit
def _rec(table, h, p, n_last, HKV: gl.constexpr, PAGE: gl.constexpr):
    """Summary record (page id * HKV + h) of item p (clamped to the chunk's last)."""
    slot = gl.load(table + gl.minimum(p, n_last) * PAGE)
    return slot // PAGE * HKV + h


@gluon.constexpr_function
def _copy_layout(BP, num_warps, rank, vec):
    """Layouts of a step's page ids and scale copies: each thread takes vec elements of one page, pages over
    (warp, thread // TP); a page's TP threads split its row (rank 3: its last dimension)."""
    BP, num_warps, rank, vec = (getattr(x, "value", x) for x in (BP, num_warps, rank, vec))
    ppw = BP // num_warps                 # pages per warp
    tp = 32 // ppw                        # threads per page
    if rank == 3:
        return gl.BlockedLayout([1, 1, vec], [ppw, 1, tp], [num_warps, 1, 1], [2, 1, 0])
    return gl.BlockedLayout([1, vec], [ppw, tp], [num_warps, 1], [1, 0])


@gluon.constexpr_function
def _page_copy_layout(num_warps, pages, rows, row_bytes):
    """Copy layout of a step's [pages, rows, row_bytes] records ([pages, row_bytes] where rows is 0) in 16-byte
    copies, `pages` pages a warp instruction: each page's share of an instruction is one run of contiguous bytes
    (a page's 16-byte pieces, row by row, over threads), further rows and pages over registers, pages over warps.
    Why: DRAM serves runs of whole pages faster than 8 pages an instruction, 64 bytes each (_copy_layout). In the
    kernels, where every thread computes an address per page it copies, the basis two pages an instruction (256
    bytes each) and the coefficients and centroids four (128 bytes) measured fastest (docs/performance.md)."""
    num_warps, pages, rows, row_bytes = (getattr(x, "value", x) for x in (num_warps, pages, rows, row_bytes))
    pieces = row_bytes // 16
    if rows == 0:
        return gl.BlockedLayout([1, 16], [pages, pieces], [num_warps, 1], [1, 0])
    return gl.BlockedLayout([1, 1, 16], [pages, 32 // (pages * pieces), pieces], [num_warps, 1, 1], [2, 1, 0])


@gluon.jit
def _step_records(table, h, p0, n_last, BP: gl.constexpr, HKV: gl.constexpr, PAGE: gl.constexpr,
                  num_warps: gl.constexpr):
    """Summary records of a step's pages, one per copying thread."""
    cpv: gl.constexpr = _copy_layout(BP, num_warps, 3, 16)
    j = gl.arange(0, BP, layout=gl.SliceLayout(1, gl.SliceLayout(2, cpv)))
    return _rec(table, h, p0 + j, n_last, HKV, PAGE)


@gluon.jit
def _stage_copy(smem_v, smem_c, smem_m, smem_s, smem_u, basis_ptr, coef_ptr, mu_ptr, coef_scale_ptr, mu_scale_ptr,
                rec, BP: gl.constexpr, D: gl.constexpr, PAGE: gl.constexpr, num_warps: gl.constexpr):
    """cp.async of one step's summaries (records rec [BP]) into one stage, 16 bytes per copy."""
    R: gl.constexpr = 8
    HALF: gl.constexpr = D // 2
    cpv: gl.constexpr = _page_copy_layout(num_warps, 2, R, HALF)
    cpc: gl.constexpr = _page_copy_layout(num_warps, 4, R, PAGE)
    cpm: gl.constexpr = _page_copy_layout(num_warps, 4, 0, D)
    cps: gl.constexpr = _copy_layout(BP, num_warps, 2, 2)
    # basis [BP, 8 ranks, 64 bytes] (the records in its layout, which the other copies' convert from)
    rec_v = gl.convert_layout(rec, gl.SliceLayout(1, gl.SliceLayout(2, cpv)))
    r3 = gl.expand_dims(gl.expand_dims(rec_v, 1), 2)
    _, i, k = _idx3(BP, R, HALF, cpv)
    async_copy.async_copy_global_to_shared(smem_v, basis_ptr + (r3 * R + i) * HALF + k)
    # coefficients [BP, 8 ranks, 16 keys]
    rc = gl.expand_dims(gl.expand_dims(gl.convert_layout(rec_v, gl.SliceLayout(1, gl.SliceLayout(2, cpc))), 1), 2)
    _, i, k = _idx3(BP, R, PAGE, cpc)
    async_copy.async_copy_global_to_shared(smem_c, coef_ptr + rc * (R * PAGE) + i * PAGE + k)
    # centroids [BP, D] (rows BP.. of the stage stay zero), coefficient scales [BP, 8], centroid scales [BP]
    r2 = gl.expand_dims(gl.convert_layout(rec_v, gl.SliceLayout(1, cpm)), 1)
    _, mk = _idx2(BP, D, cpm)
    async_copy.async_copy_global_to_shared(smem_m.slice(0, BP, 0), mu_ptr + r2 * D + mk)
    rs = gl.convert_layout(rec, gl.SliceLayout(1, cps))
    _, sk = _idx2(BP, R, cps)
    async_copy.async_copy_global_to_shared(smem_s, coef_scale_ptr + gl.expand_dims(rs, 1) * R + sk)
    async_copy.async_copy_global_to_shared(smem_u.slice(0, BP, 0), mu_scale_ptr + rs)
    async_copy.commit_group()


@gluon.jit
def _stage_buffers(STAGES: gl.constexpr, BP: gl.constexpr, MU_ROWS: gl.constexpr, D: gl.constexpr,
                   PAGE: gl.constexpr):
    """Shared memory for STAGES steps of summaries: basis, coefficients, centroids, coefficient scales,
    centroid scales. Rows of 16-byte copies; the basis rows swizzled so that the eight rows one mma fragment
    reads hit distinct banks."""
    R: gl.constexpr = 8
    sw_v: gl.constexpr = gl.SwizzledSharedLayout(vec=16, per_phase=2, max_phase=4, order=[2, 1, 0])
    flat3: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[2, 1, 0])
    flat1: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    flat2: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    # centroid rows (128 bytes) swizzled in 16-byte units within each half: the mma's row fetches meet 2-way, not
    # 8-way, bank conflicts
    sw_m: gl.constexpr = gl.SwizzledSharedLayout(vec=16, per_phase=1, max_phase=4, order=[1, 0])
    smem_v = gl.allocate_shared_memory(gl.uint8, [STAGES, BP, R, D // 2], sw_v)
    smem_c = gl.allocate_shared_memory(gl.int8, [STAGES, BP, R, PAGE], flat3)
    smem_m = gl.allocate_shared_memory(gl.int8, [STAGES, MU_ROWS, D], sw_m)
    smem_s = gl.allocate_shared_memory(gl.float32, [STAGES, BP, R], flat2)
    smem_u = gl.allocate_shared_memory(gl.float32, [STAGES, MU_ROWS], flat1)
    return smem_v, smem_c, smem_m, smem_s, smem_u


@gluon.jit
def _row_span(req_to_token_ptr, stride_rt, req_pool_ptr, seq_lens_ptr, max_pages, n_chunks, BP: gl.constexpr,
              HKV: gl.constexpr, PAGE: gl.constexpr):
    """The program's (request b, KV head h), its request's page table and its chunk's sealed pages
    [start, end), n_last = end - 1 (or 0), in steps of BP pages."""
    row = gl.program_id(0)
    chunk = gl.program_id(1)
    b = row // HKV
    h = row % HKV
    n_sealed = gl.minimum(gl.load(seq_lens_ptr + b) // PAGE, max_pages)
    table = req_to_token_ptr + gl.load(req_pool_ptr + b).to(gl.int64) * stride_rt
    row_chunk = gl.cdiv(gl.cdiv(n_sealed, n_chunks), BP) * BP
    start = chunk * row_chunk
    end = gl.minimum(start + row_chunk, n_sealed)
    return b, h, table, start, end, gl.maximum(end - 1, 0), gl.cdiv(end - start, BP)


@gluon.jit
def _prologue(smem_v, smem_c, smem_m, smem_s, smem_u, basis_ptr, coef_ptr, mu_ptr, coef_scale_ptr, mu_scale_ptr,
              table, h, start, n_last, BP: gl.constexpr, HKV: gl.constexpr, D: gl.constexpr, PAGE: gl.constexpr,
              STAGES: gl.constexpr, num_warps: gl.constexpr):
    """The first STAGES - 1 steps in flight; returns the records of the next one."""
    for z in gl.static_range(STAGES - 1):
        rec = _step_records(table, h, start + z * BP, n_last, BP, HKV, PAGE, num_warps)
        _stage_copy(smem_v.index(z), smem_c.index(z), smem_m.index(z), smem_s.index(z), smem_u.index(z),
                    basis_ptr, coef_ptr, mu_ptr, coef_scale_ptr, mu_scale_ptr, rec, BP, D, PAGE, num_warps)
    return _step_records(table, h, start + (STAGES - 1) * BP, n_last, BP, HKV, PAGE, num_warps)


@gluon.jit
def _next_step(smem_v, smem_c, smem_m, smem_s, smem_u, basis_ptr, coef_ptr, mu_ptr, coef_scale_ptr, mu_scale_ptr,
               rec_next, it, table, h, start, n_last, BP: gl.constexpr, HKV: gl.constexpr, D: gl.constexpr,
               PAGE: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """Step it of the page loop: the step STAGES - 1 ahead copied into the stage read last step (every thread is
    past its reads), the page ids a step further ahead loaded (they overlap this step), step it's stage awaited.
    Returns (those page ids, step it's stage, its first page)."""
    gl.thread_barrier()
    ns = ((it + STAGES - 1) % STAGES).to(gl.int32)   # int64 with SGLang's int64 lengths
    _stage_copy(smem_v.index(ns), smem_c.index(ns), smem_m.index(ns), smem_s.index(ns), smem_u.index(ns),
                basis_ptr, coef_ptr, mu_ptr, coef_scale_ptr, mu_scale_ptr, rec_next, BP, D, PAGE, num_warps)
    rec_next = _step_records(table, h, start + (it + STAGES) * BP, n_last, BP, HKV, PAGE, num_warps)
    async_copy.wait_group(STAGES - 1)
    gl.thread_barrier()
    return rec_next, (it % STAGES).to(gl.int32), start + it * BP


@gluon.jit
def _store_scores(scores_ptr, out_row, max_pages, p, valid, s2, run_m, run_s, KEEP: gl.constexpr):
    """Store a step's scores s2 (log2 domain; pages p where valid) in nats (L2 eviction policy KEEP) and fold
    them into the running per-position (max, sum) of the chunk's partials. Returns the new (run_m, run_s)."""
    s2 = gl.where(valid, s2, float("-inf"))
    gl.store(scores_ptr + out_row * max_pages + p, s2 * _LN2, mask=valid, eviction_policy=KEEP)
    bm = gl.maximum(run_m, s2)
    run_s = run_s * gl.exp2(run_m - bm) + gl.where(valid, gl.exp2(s2 - bm), 0.0)
    return bm, run_s


@gluon.jit
def _store_partials(part_max_ptr, part_sum_ptr, part_stride, part_first, mass_ptr, run_m, run_s, row0,
                    G: gl.constexpr, GH: gl.constexpr, AXIS: gl.constexpr, KEEP: gl.constexpr, MASS: gl.constexpr):
    """The program's chunk partials: per query head (max, sum) of its running per-position ones, reduced along
    the positions' page axis AXIS; heads row0 + [0, G) of the GH (padded) along the other. MASS > 0: each head's
    chunk mass also added to mass_ptr[head, chunk % MASS] (float64, see launch_score_kernel)."""
    hm = gl.max(run_m, AXIS)
    hs = gl.sum(gl.where(run_s > 0, run_s * gl.exp2(run_m - gl.expand_dims(hm, AXIS)), 0.0), AXIS)
    gg = gl.arange(0, GH, layout=hm.type.layout)
    part = (row0 + gg).to(gl.int64) * part_stride + part_first + gl.program_id(1)  # the chunk
    gl.store(part_max_ptr + part, hm * _LN2, mask=gg < G, eviction_policy=KEEP)
    gl.store(part_sum_ptr + part, hs, mask=gg < G, eviction_policy=KEEP)
    if MASS > 0:
        # hs * 2^hm in float64 (2^-1022..2^1023: log2 masses within +-1000, i.e. page scores within ~690 nats)
        hm64 = gl.minimum(gl.maximum(gl.where(hs > 0, hm, 0.0), -1000.0), 1000.0).to(gl.float64)
        slot = (row0 + gg).to(gl.int64) * MASS + gl.program_id(1) % MASS
        gl.atomic_add(mass_ptr + slot, hs.to(gl.float64) * gl.exp2(hm64), mask=(gg < G) & (hs > 0), sem="relaxed")
