"""score_pages: estimated log attention mass of every sealed page, from summaries only.

    s[b, hq, p] = logsumexp_i [ (q . mu_p + (V_p q) . c_p,i) * sm_scale ]

The kernel never reads K or V. Bytes per (page, KV head): the summary (804 at
d=128, r=8, int8-int4-int8) + 4 for the page id + 4*G for the scores written.
Work per (page, KV head) on tensor cores, G query heads padded to 16 rows:

  1. q . mu and q . V (d x (r pages)) as two 2-D dots, the basis columns of
     BLOCK_P pages side by side (N = BLOCK_P * r): the dominant FLOPs.
  2. the per-key term sum_r (V q)_r c_ir as a batched dot over groups of
     16 // r pages, whose coefficients form a block-diagonal [16, 16*pages]
     operand (K = 16 satisfies tl.dot without padding r). On CUDA cores
     instead (G*r*16 multiply-adds per page) it measured slower: Triton's
     layout conversions for the 4-D broadcast.

int4 and int8 operands become exact fp16 integers with two or three integer
instructions per four values (magic-number conversion: 0x64 in a half's high
byte makes it 1024 + the low byte), instead of quarter-rate int-to-float
conversions, which would cost more than reading the bytes (plain casts
measured slower: Triton does not keep the narrow bytes in shared memory for
the dots either way). The padded query
rows are zero, so summing the [16 // G, G] row blocks drops them before the
exponentials; a G that is not a power of two (Qwen2.5-7B: 7, -14B: 5) is
padded with zero query rows to the next one, whose scores are not stored.
One program scores a chunk of pages of one (request, KV head) in a loop
(loads of the next block overlap the current one's math) and writes per
query head the max and sum of exp over its chunk, so aggregate_scores can
normalise per head without another pass over all scores.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._triton import interpreted, num_sms

LOG2E = 1.4426950408889634
_LOG2E = tl.constexpr(LOG2E)
LN2 = tl.constexpr(0.6931471805599453)


# Four bytes holding two int4 each (low nibble: element k, high: k + d/2) -> int8 16 x the low and the high
# elements: the nibbles moved to the top of a byte, four bytes per 32-bit instruction.
INT4_TO_INT8X16_PTX = tl.constexpr("""
{
shl.b32 $0, $2, 4;
and.b32 $0, $0, 0xF0F0F0F0;
and.b32 $1, $2, 0xF0F0F0F0;
}
""")
# Four int8 -> four exact fp16: xor 0x80 gives b + 128 in [0, 255], and the byte 0x64 above it makes the
# half 1024 + that (a plain conversion is one quarter-rate instruction per value).
INT8_TO_F16_PTX = tl.constexpr("""
{
.reg .b32 y, mag, off;
mov.b32 mag, 0x64646464;
mov.b32 off, 0x64806480;
xor.b32 y, $2, 0x80808080;
prmt.b32 $0, y, mag, 0x5140;
prmt.b32 $1, y, mag, 0x5342;
sub.f16x2 $0, $0, off;
sub.f16x2 $1, $1, off;
}
""")

# Integer-to-float conversion of the summaries (constexpr CVT): 0 float32 casts (Triton's
# interpreter, whose fp16/bf16 dots are unreliable), 2 fp16 by the PTX magic-number trick (GPUs).
# "int8" multiplies basis and centroids as integers; the coefficients still convert by PTX.
CONVERSIONS = {"ptx": 2, "int8": 2}


@triton.jit
def _to_dot_dtype(x, CVT: tl.constexpr):
    if CVT == 0:
        y = x.to(tl.float32)
    else:
        y = x.to(tl.float16)
    return y


@triton.jit
def _int4_to_f16(x, CVT: tl.constexpr):
    """uint8 bytes holding two int4 (low nibble: element k, high: element k + d/2) -> (lo, hi)."""
    if CVT == 2:
        # xor 0x8 turns a nibble v into v + 8 in [0, 15]; 0x6400 | n is the half 1024 + n.
        lo, hi = tl.inline_asm_elementwise(
            asm="""
            {
            .reg .b32 y, t0, t1, z, mag, off;
            mov.b32 z, 0;
            mov.b32 mag, 0x64006400;
            mov.b32 off, 0x64086408;
            xor.b32 y, $4, 0x88888888;
            prmt.b32 t0, y, z, 0x4140;
            prmt.b32 t1, y, z, 0x4342;
            lop3.b32 $0, t0, 0x000F000F, mag, 0xEA;
            lop3.b32 $1, t1, 0x000F000F, mag, 0xEA;
            shr.u32 t0, t0, 4;
            shr.u32 t1, t1, 4;
            lop3.b32 $2, t0, 0x000F000F, mag, 0xEA;
            lop3.b32 $3, t1, 0x000F000F, mag, 0xEA;
            sub.f16x2 $0, $0, off;
            sub.f16x2 $1, $1, off;
            sub.f16x2 $2, $2, off;
            sub.f16x2 $3, $3, off;
            }
            """,
            constraints="=r,=r,=r,=r,r",
            args=[x],
            dtype=(tl.float16, tl.float16),
            is_pure=True,
            pack=4,
        )
    else:
        xi = x.to(tl.int32)
        lo = _to_dot_dtype(((xi & 15) ^ 8) - 8, CVT)
        hi = _to_dot_dtype((((xi >> 4) & 15) ^ 8) - 8, CVT)
    return lo, hi


@triton.jit
def _log2(x, CVT: tl.constexpr):
    """log2 by the SFU (lg2.approx, relative error ~2^-22) on GPUs; Triton's tl.log2 is the
    libdevice one, ~15 instructions per value."""
    if CVT == 0:
        y = tl.log2(x)
    else:
        y = tl.inline_asm_elementwise(asm="lg2.approx.f32 $0, $1;", constraints="=r,r", args=[x],
                                      dtype=tl.float32, is_pure=True, pack=1)
    return y


@triton.jit
def _int4_to_int8x16(x, CVT: tl.constexpr):
    """uint8 bytes holding two int4 (low nibble: element k, high: k + d/2) -> int8 (16 lo, 16 hi):
    the nibbles moved to the top of a byte, four bytes per 32-bit instruction (Triton's own
    8-bit shifts unpack and repack every byte)."""
    if CVT == 2:
        lo, hi = tl.inline_asm_elementwise(
            asm=INT4_TO_INT8X16_PTX,
            constraints="=r,=r,r",
            args=[x],
            dtype=(tl.int8, tl.int8),
            is_pure=True,
            pack=4,
        )
    else:
        lo = (x << 4).to(tl.int8, bitcast=True)
        hi = (x & 0xF0).to(tl.int8, bitcast=True)
    return lo, hi


@triton.jit
def _int8_to_f16(x, CVT: tl.constexpr):
    if CVT == 2:
        y = tl.inline_asm_elementwise(
            asm=INT8_TO_F16_PTX,
            constraints="=r,=r,r",
            args=[x],
            dtype=tl.float16,
            is_pure=True,
            pack=4,
        )
    else:
        y = _to_dot_dtype(x, CVT)
    return y


@triton.jit
def _operand(x, QUANT: tl.constexpr, CVT: tl.constexpr):
    """A summary tile as a dot operand: int8 converted exactly, floats as they are."""
    if QUANT:
        y = _int8_to_f16(x, CVT)
    else:
        y = _to_dot_dtype(x, CVT)
    return y


@triton.jit
def _int8_query_planes(q_base, stride_qh, G: tl.constexpr, GQ: tl.constexpr, GP: tl.constexpr, HALF: tl.constexpr,
                       scale_log2):
    """Query heads as two int8 planes for integer tensor-core dots: rows [0, GQ) hold
    q1 = round(q / s), rows [GQ, 2 GQ) q2 = round((q / s - q1) * 254) (s = max|q| / 127 per
    head), the rest (and the rows of heads G..GQ, padding to a power of two) zeros; q = s (q1 + q2 / 254)
    to 2^-16 of max|q|, finer than fp16.
    Returns (low half, high half) [GP, HALF] int8 and the row weights [GP] (scale_log2 folded in)."""
    g = tl.arange(0, GP)
    plane = g // GQ
    k = tl.arange(0, HALF)
    ptr = q_base + (g % GQ)[:, None] * stride_qh + k[None, :]
    live = ((plane < 2) & (g % GQ < G))[:, None]
    lo = tl.load(ptr, mask=live, other=0.0).to(tl.float32)
    hi = tl.load(ptr + HALF, mask=live, other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(lo), 1), tl.max(tl.abs(hi), 1))
    s = tl.where(amax > 0, amax / 127.0, 1.0)
    lo = lo / s[:, None]
    hi = hi / s[:, None]
    lo1 = tl.floor(lo + 0.5)
    hi1 = tl.floor(hi + 0.5)
    first = (plane == 0)[:, None]
    q8_lo = tl.where(first, lo1, tl.floor((lo - lo1) * 254.0 + 0.5)).to(tl.int8)
    q8_hi = tl.where(first, hi1, tl.floor((hi - hi1) * 254.0 + 0.5)).to(tl.int8)
    weight = tl.where(plane == 0, s, tl.where(plane == 1, s / 254.0, 0.0)) * scale_log2
    return q8_lo, q8_hi, weight


@triton.jit
def _centroid_term(q_lo, q_hi, mu_base, mu_scale, scale_log2, HALF: tl.constexpr, QUANT: tl.constexpr,
                   CVT: tl.constexpr):
    """q . mu of a block's pages by fp16 dots (float32 in the interpreter), log2 units: [rows of q, pages]."""
    mu_lo = _operand(tl.load(mu_base), QUANT, CVT)
    mu_hi = _operand(tl.load(mu_base + HALF), QUANT, CVT)
    return (tl.dot(q_lo, mu_lo) + tl.dot(q_hi, mu_hi)) * (mu_scale * scale_log2)[None, :]


@triton.jit
def _basis_term(q_lo, q_hi, basis_ptr, row_n, live_r, k, cs, scale_log2, D: tl.constexpr, QUANT: tl.constexpr,
                CVT: tl.constexpr):
    """V q of a block's basis rows row_n (scaled by cs) by fp16 dots, log2 units: [rows of q, basis rows]."""
    HALF: tl.constexpr = D // 2
    if QUANT:
        vb = tl.load(basis_ptr + row_n[None, :] * HALF + k[:, None], mask=live_r[None, :], other=0)
        v_lo, v_hi = _int4_to_f16(vb, CVT)
    else:
        v_base = basis_ptr + row_n[None, :] * D + k[:, None]
        v_lo = _operand(tl.load(v_base, mask=live_r[None, :], other=0.0), False, CVT)
        v_hi = _operand(tl.load(v_base + HALF, mask=live_r[None, :], other=0.0), False, CVT)
    return (tl.dot(q_lo, v_lo) + tl.dot(q_hi, v_hi)) * (cs * scale_log2)[None, :]


@triton.jit
def _page_lse(proj, c_rows, G: tl.constexpr, GP: tl.constexpr, BLOCK_P: tl.constexpr, RP: tl.constexpr,
              PAGE: tl.constexpr, QUANT: tl.constexpr, CVT: tl.constexpr):
    """Per-key term on tensor cores, per group of SUB pages: [NG, GP, SUB*RP] x block-diagonal
    [NG, SUB*RP, SUB*PAGE] (the coefficient rows spread into the operand in registers), then
    the log-sum-exp over each page's keys in log2 units -> [G, BLOCK_P] (the centroid term
    q . mu, common to a page's keys, is the caller's). proj [GP, BLOCK_P*RP] holds GP // G
    row blocks that add up (zero padding, or int8 query planes)."""
    SUB: tl.constexpr = 16 // RP
    NG: tl.constexpr = BLOCK_P // SUB
    FOLD: tl.constexpr = GP // G
    same_page = tl.arange(0, SUB)[:, None] == tl.arange(0, SUB)[None, :]
    proj3 = tl.permute(tl.reshape(proj, (GP, NG, SUB * RP)), (1, 0, 2))
    c5 = tl.broadcast_to(tl.reshape(_operand(c_rows, QUANT, CVT), (NG, SUB, RP, 1, PAGE)), (NG, SUB, RP, SUB, PAGE))
    cbd = tl.where(same_page[None, :, None, :, None], c5, tl.zeros_like(c5))
    cbd = tl.reshape(cbd, (NG, SUB * RP, SUB * PAGE))
    local = tl.dot(_to_dot_dtype(proj3, CVT), cbd)   # [NG, GP, SUB*PAGE]
    # Add up the row blocks; log-sum-exp of each page's per-key terms, then + q . mu (the centroid
    # term is common to the page's keys). No running max: a page's coefficients are centred (they
    # sum to zero over its keys), so its largest per-key term is >= their mean ~ 0 and the sum of
    # exponentials >= ~1; the clamp at 2^120 keeps the sum of 16 finite (a page that far above
    # its centroid logit still scores >= q . mu + 120).
    local = tl.sum(tl.reshape(local, (NG, FOLD, G, SUB * PAGE)), 1)
    mass = tl.sum(tl.exp2(tl.minimum(tl.reshape(local, (NG, G, SUB, PAGE)), 120.0)), 3)  # [NG, G, SUB]
    return tl.reshape(tl.permute(_log2(mass, CVT), (1, 0, 2)), (G, BLOCK_P))


# What a launch scores (TERMS): every sealed page in full; every sealed page by an estimate from
# its summary's first R ranks (the prefilter; R = 0: the centroid alone, q . mu + log 16); or the
# pages of a candidate list in full.
TERMS = {"full": 0, "estimate": 1, "candidates": 2}


@triton.jit
def _score_pages_kernel(
    q_ptr, stride_qb, stride_qh,
    mu_ptr, mu_scale_ptr, basis_ptr, coef_ptr, coef_scale_ptr,
    req_to_token_ptr, stride_rt, req_pool_ptr, seq_lens_ptr, cand_pages_ptr, cand_slots_ptr, n_cand, est_ptr,
    scores_ptr, part_max_ptr, part_sum_ptr, part_stride, part_first,
    max_pages, n_chunks, scale_log2,
    HKV: tl.constexpr, G: tl.constexpr, GQ: tl.constexpr, D: tl.constexpr, R: tl.constexpr, RS: tl.constexpr,
    RP: tl.constexpr, PAGE: tl.constexpr, BLOCK_P: tl.constexpr, QUANT: tl.constexpr, CVT: tl.constexpr,
    BIG: tl.constexpr, IDOT: tl.constexpr, GP: tl.constexpr, TERMS: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    b = row // HKV
    h = row % HKV
    HALF: tl.constexpr = D // 2
    FOLD: tl.constexpr = GP // GQ
    # GQ: the G query heads padded with zero rows to a power of two (their scores are not stored).
    # GP: query rows of a dot: GQ padded with zero rows to 16, or (IDOT) two int8 planes of GQ rows.
    n_sealed = tl.minimum(tl.load(seq_lens_ptr + b) // PAGE, max_pages)
    table = req_to_token_ptr + tl.load(req_pool_ptr + b).to(tl.int64) * stride_rt
    # Items: the sealed pages, scores written at their logical page; or (candidates) the row's
    # first min(n_sealed, n_cand) candidates, read as their first slots, scores written in candidate order.
    # R of the RS ranks stored per page enter the scores (R < RS: an estimate).
    if TERMS == 2:
        n_items = tl.minimum(n_sealed, n_cand)
        cand_row = cand_slots_ptr + row.to(tl.int64) * n_cand
        cand_pages = cand_pages_ptr + row.to(tl.int64) * n_cand
        width = n_cand
    else:
        n_items = n_sealed
        width = max_pages
    # The grid is sized for max_pages (static under CUDA graphs, e.g. the server's context
    # length); this row's items are split over all of its chunks, in whole blocks.
    row_chunk = tl.cdiv(tl.cdiv(n_items, n_chunks), BLOCK_P) * BLOCK_P
    start = chunk * row_chunk
    end = tl.minimum(start + row_chunk, n_items)

    k = tl.arange(0, HALF)
    if IDOT:
        q_lo, q_hi, q_weight = _int8_query_planes(q_ptr + b * stride_qb + h * G * stride_qh, stride_qh, G, GQ, GP,
                                                  HALF, scale_log2)
    else:
        g = tl.arange(0, GP)
        q_base = q_ptr + b * stride_qb + (h * G + g)[:, None] * stride_qh + k[None, :]
        q_lo = _to_dot_dtype(tl.load(q_base, mask=(g < G)[:, None], other=0.0), CVT)
        q_hi = _to_dot_dtype(tl.load(q_base + HALF, mask=(g < G)[:, None], other=0.0), CVT)

    gg = tl.arange(0, GQ)
    real = gg < G
    out_rows = (b * HKV * G + h * G + gg).to(tl.int64)
    run_m = tl.full((GQ,), float("-inf"), tl.float32)
    run_s = tl.zeros((GQ,), tl.float32)
    jp = tl.arange(0, BLOCK_P)
    n = tl.arange(0, BLOCK_P * RP)        # basis column (page j, rank r) = (n // RP, n % RP)
    e = tl.arange(0, RP * PAGE)           # a page's coefficients, r-major

    r_n = n % RP
    live_r = r_n < R                      # basis columns of real ranks (RP pads the rank)
    # Page ids of the next block are loaded one iteration ahead: the summary loads that
    # depend on them then wait for one memory round trip, not two. Positions past the chunk's
    # items read its last item: every summary load is in bounds and unmasked, and those
    # columns are dropped at the store.
    last = tl.maximum(end - 1, 0)
    if TERMS == 2:
        slot_next = tl.load(cand_row + tl.minimum(start + jp, last))
    else:
        slot_next = tl.load(table + tl.minimum(start + jp, last) * PAGE)
    for p0 in range(start, end, BLOCK_P):
        p = p0 + jp
        valid = p < end
        slot = slot_next
        if TERMS == 2:
            slot_next = tl.load(cand_row + tl.minimum(p + BLOCK_P, last))
        else:
            slot_next = tl.load(table + tl.minimum(p + BLOCK_P, last) * PAGE)
        rec = slot // PAGE * HKV + h   # summary record of (page, KV head)
        if BIG:
            rec = rec.to(tl.int64)

        # q . mu: [GP, BLOCK_P]
        mu_base = mu_ptr + rec[None, :] * D + k[:, None]
        mu_scale = tl.load(mu_scale_ptr + rec)
        if IDOT:
            mu_lo = tl.load(mu_base)
            mu_hi = tl.load(mu_base + HALF)
            qmu = tl.dot(q_lo, mu_lo, out_dtype=tl.int32) + tl.dot(q_hi, mu_hi, out_dtype=tl.int32)
            qmu = qmu.to(tl.float32) * q_weight[:, None] * mu_scale[None, :]
        else:
            qmu = _centroid_term(q_lo, q_hi, mu_base, mu_scale, scale_log2, HALF, QUANT, CVT)
        qmu = tl.sum(tl.reshape(qmu, (FOLD, GQ, BLOCK_P)), 0)

        if R == 0:
            # q . mu + log 16 (log2 units): the page's score if its keys all sat on the centroid, and a
            # lower bound of its full score (Jensen: the coefficients are centred).
            s2 = qmu + 4.0
        else:
            # V q for the r basis rows of every page: [GP, BLOCK_P * RP]
            rec_n = tl.reshape(tl.broadcast_to(rec[:, None], (BLOCK_P, RP)), (BLOCK_P * RP,))
            row_n = rec_n * RS + r_n              # basis row and coefficient scale of each column
            cs = tl.load(coef_scale_ptr + row_n, mask=live_r, other=0.0)
            if IDOT:
                # Nibbles moved to the top of a byte are int8 values of 16 x the int4 element: a shift
                # and masks per four bytes, no conversion, and half the operand bytes of fp16.
                vb = tl.load(basis_ptr + row_n[None, :] * HALF + k[:, None], mask=live_r[None, :], other=0)
                v_lo, v_hi = _int4_to_int8x16(vb, CVT)
                proj = tl.dot(q_lo, v_lo, out_dtype=tl.int32) + tl.dot(q_hi, v_hi, out_dtype=tl.int32)
                proj = proj.to(tl.float32) * q_weight[:, None] * (cs * 0.0625)[None, :]
            else:
                proj = _basis_term(q_lo, q_hi, basis_ptr, row_n, live_r, k, cs, scale_log2, D, QUANT, CVT)
            # proj is in log2-domain logit units: safe in fp16 for the per-key dot

            # Each page's coefficients are one contiguous load.
            c_rows = tl.load(coef_ptr + rec[:, None] * (RS * PAGE) + e[None, :], mask=(e < R * PAGE)[None, :], other=0)
            s2 = _page_lse(proj, c_rows, GQ, GP, BLOCK_P, RP, PAGE, QUANT, CVT) + qmu
        s2 = tl.where(valid[None, :], s2, float("-inf"))
        tl.store(scores_ptr + out_rows[:, None] * width + p[None, :], s2 * LN2, mask=real[:, None] & valid[None, :])

        bm = tl.maximum(run_m, tl.max(s2, 1))
        if TERMS == 2:
            # A candidate's mass replaces its estimate, which the estimate launch's partials counted:
            # these partials sum the differences (of either sign; each head's total stays positive).
            page = tl.load(cand_pages + p, mask=valid, other=0)
            est = tl.load(est_ptr + out_rows[:, None] * max_pages + page[None, :],
                          mask=real[:, None] & valid[None, :], other=float("-inf")) * _LOG2E
            grow = tl.where(valid[None, :], tl.exp2(s2 - bm[:, None]) - tl.exp2(est - bm[:, None]), 0.0)
        else:
            grow = tl.exp2(s2 - bm[:, None])
        run_s = run_s * tl.exp2(run_m - bm) + tl.sum(grow, 1)
        run_m = bm

    part = out_rows * part_stride + part_first + chunk
    tl.store(part_max_ptr + part, run_m * LN2, mask=real)
    tl.store(part_sum_ptr + part, run_s, mask=real)


BLOCK_PAGES = 16
MAX_GROUP = 16  # query heads per KV head: padded to a power of two, within one 16-row tile
# (num_warps, num_stages, maxnreg; 0: the compiler's choice): the fastest of an H200 sweep
# (benchmarks/score_sweep.py) for integer dots at G = 4 and G = 16; float summaries keep the
# uncapped launch (the cap is untimed there).
_INT8_LAUNCH = {16: (2, 2, 128), 32: (4, 2, 128)}  # by the dot's query rows: 2G padded to 16
_FLOAT_LAUNCH = (2, 3, 0)


def default_launch(group: int, integer_dots: bool) -> tuple:
    """(num_warps, num_stages, maxnreg) of the score kernel for G query heads per KV head."""
    if not integer_dots:
        return _FLOAT_LAUNCH
    return _INT8_LAUNCH[max(16, 2 * triton.next_power_of_2(group))]


_PROGRAMS_PER_SM = 8


def row_chunks(n_sealed: int, n_chunks: int, block_pages: int = BLOCK_PAGES) -> int:
    """Pages per chunk of a row with n_sealed sealed pages (the kernel's split, for references)."""
    return triton.cdiv(triton.cdiv(n_sealed, n_chunks), block_pages) * block_pages


def chunk_pages_for(batch_rows: int, max_pages: int, device: torch.device, block_pages: int = BLOCK_PAGES,
                    programs_per_sm: int = _PROGRAMS_PER_SM) -> int:
    """Pages per program: enough programs to fill the GPU, few enough to amortise q and the loop."""
    blocks = triton.cdiv(max(max_pages, 1), block_pages)
    chunks_per_row = max(1, min(blocks, triton.cdiv(programs_per_sm * num_sms(device), batch_rows)))
    return triton.cdiv(blocks, chunks_per_row) * block_pages


# Shared memory the kernel needs besides the loads of blocks in flight (layout conversions).
_SCRATCH_BYTES = 32 * 1024


def _shared_memory_per_block(device: torch.device) -> int:
    if device.type != "cuda":
        return 227 * 1024  # the H200's; the interpreter ignores num_stages
    props = torch.cuda.get_device_properties(device)
    return getattr(props, "shared_memory_per_block_optin", props.shared_memory_per_block)


def pipeline_stages(summaries, block_pages: int, rank_p: int, num_stages: int, shared_memory: int) -> int:
    """num_stages, cut where the summaries (centroid and rank_p ranks) of num_stages - 1 blocks in
    flight would overflow shared_memory bytes per block (float summaries at rank > 8: 152 KiB per
    block at fp32)."""
    s = summaries
    per_page = s.mu.shape[-1] * s.mu.element_size()
    per_page += rank_p * (s.basis.shape[-1] * s.basis.element_size() + s.coef.shape[-1] * s.coef.element_size())
    per_block = block_pages * per_page
    return max(1, min(num_stages, 1 + (shared_memory - _SCRATCH_BYTES) // per_block))


# An estimate launch's (block_pages, num_warps, num_stages, maxnreg) by its ranks: its pages cost 132
# (centroid) to 300 (rank 2) bytes each, not 804, so blocks of 16 would leave the loop's overhead per
# page dominant. These were the fastest of H200 sweeps of one layer at bs=1.
_CENTROID_ESTIMATE_LAUNCH = (128, 4, 2, 0)
_RANKED_ESTIMATE_LAUNCH = (64, 4, 2, 0)


def score_launch(group: int, integer_dots: bool, terms: str, estimate_rank: int = 0) -> tuple:
    """(block_pages, num_warps, num_stages, maxnreg) of the score kernel for a launch of terms."""
    if terms == "estimate":
        return _RANKED_ESTIMATE_LAUNCH if estimate_rank else _CENTROID_ESTIMATE_LAUNCH
    return (BLOCK_PAGES,) + default_launch(group, integer_dots)


def estimate_block_pages(estimate_rank: int) -> int:
    """Pages per block of an estimate launch from estimate_rank ranks (its chunks follow from it)."""
    return score_launch(1, True, "estimate", estimate_rank)[0]


def score_chunks(rows: int, items: int, device: torch.device, block_pages: int, chunk_pages: int = None) -> tuple:
    """(pages per program, programs per row) of a launch over items pages (or candidates) per row;
    chunk_pages: the caller's choice of the first."""
    chunk = chunk_pages or chunk_pages_for(rows, items, device, block_pages)
    return chunk, max(1, triton.cdiv(items, chunk))


def score_outputs(bsz: int, hq: int, width: int, n_chunks: int, device, out=None) -> tuple:
    """(scores [B, Hq, width], part_max, part_sum, first chunk): allocated, or the caller's out checked."""
    if out is None:
        part_max = torch.empty(bsz, hq, n_chunks, dtype=torch.float32, device=device)
        return torch.empty(bsz, hq, width, dtype=torch.float32, device=device), part_max, torch.empty_like(part_max), 0
    scores, part_max, part_sum, first = out
    if scores.shape != (bsz, hq, width):
        raise ValueError(f"scores must be [{bsz}, {hq}, {width}], got {tuple(scores.shape)}")
    if first + n_chunks > part_max.shape[-1]:
        raise ValueError(f"chunks [{first}, {first + n_chunks}) exceed the partials' {part_max.shape[-1]}")
    return out


def score_pages_triton(q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale,
                       block_pages=None, num_warps=None, num_stages=None, chunk_pages=None,
                       int_conversion="int8", maxnreg=None, terms="full", estimate_rank=0, candidates=None,
                       estimates=None, out=None):
    """Launch the scoring kernel.

    q [B, Hq, d]; summaries: PageSummaries of this layer; req_to_token [R, ctx]
    int32 slot table; req_pool_indices [B]; seq_lens [B] (tokens in the cache,
    the unsealed tail included); max_pages >= max(seq_lens) // 16 sizes the
    buffers and the grid (n_chunks = max_pages / chunk_pages programs per row);
    each row's sealed pages are spread over all of its n_chunks (row_chunks).
    int_conversion: "int8" (integer dots against int8 planes of q, see
    _int8_query_planes; the fastest) or "ptx" (fp16 dots, int operands
    converted by PTX). block_pages,
    num_warps, num_stages and maxnreg (registers per thread, 0: no cap)
    default to score_launch's.
    Returns scores [B, Hq, max_pages] (natural-log mass; entries past a
    request's sealed pages are not written, aggregate_scores masks them) and
    per-chunk (max, sum-exp) partials [B, Hq, n_chunks] (empty chunks: -inf, 0).

    terms: "full" scores every sealed page; "estimate" every sealed page from
    the centroid and the first estimate_rank ranks of its summary (0: q . mu
    + log 16); "candidates" scores in full each (request, KV head) row's
    first min(n_sealed, M) candidates of candidates [2, >= B * H_kv, M]
    (candidate_pages_triton's logical pages and first slots), scores
    [B, Hq, M] in candidate order, and its partials sum, per chunk, each
    candidate's mass less its estimate in estimates (an estimate launch's
    scores): with that launch's partials they make each head's total. out:
    (scores, part_max, part_sum, first) to write into, this launch's
    partials at chunks [first, first + n_chunks) of part_max's last dimension.
    """
    bsz, hq, d = q.shape
    hkv, rank = summaries.num_kv_heads, summaries.rank
    group = hq // hkv
    if not 1 <= group <= MAX_GROUP:
        raise ValueError(f"query heads per KV head must be 1..{MAX_GROUP}, got {group}")
    padded = triton.next_power_of_2(group)
    if terms not in TERMS:
        raise ValueError(f"terms must be one of {sorted(TERMS)}, got {terms!r}")
    if (terms == "candidates") != (candidates is not None) or (candidates is None) != (estimates is None):
        raise ValueError("candidates [2, B * H_kv, M] and estimates are given exactly when terms='candidates'")
    if not 0 <= estimate_rank <= rank:
        raise ValueError(f"estimate_rank must be in [0, rank={rank}], got {estimate_rank}")
    used = estimate_rank if terms == "estimate" else rank
    if candidates is not None and (candidates.dim() != 3 or candidates.shape[0] != 2 or not candidates.is_contiguous()
                                   or candidates.shape[1] < bsz * hkv):
        raise ValueError(f"candidates must be a contiguous [2, >= {bsz * hkv}, M] tensor, got {tuple(candidates.shape)}")
    rank_p = triton.next_power_of_2(max(used, 1))
    if int_conversion not in CONVERSIONS:
        raise ValueError(f"int_conversion must be one of {sorted(CONVERSIONS)}, got {int_conversion!r}")
    # int8: the basis and centroids meet two int8 planes of q on integer tensor cores (quantised summaries only).
    idot = int_conversion == "int8" and summaries.quantized
    launch = score_launch(group, idot, terms, estimate_rank)
    block_pages = block_pages or launch[0]
    if block_pages * rank_p < 16 or block_pages % max(1, 16 // rank_p):
        raise ValueError(f"block_pages={block_pages} too small for rank {rank}")
    num_warps = num_warps or launch[1]
    num_stages = num_stages or launch[2]
    maxnreg = launch[3] if maxnreg is None else maxnreg
    n_cand = max_pages if candidates is None else candidates.shape[2]
    chunk_pages, n_chunks = score_chunks(bsz * hkv, n_cand, q.device, block_pages, chunk_pages)
    scores, part_max, part_sum, first = score_outputs(bsz, hq, n_cand, n_chunks, q.device, out)
    if estimates is not None and estimates.shape != (bsz, hq, max_pages):
        raise ValueError(f"estimates must be [{bsz}, {hq}, {max_pages}], got {tuple(estimates.shape)}")
    if q.stride(2) != 1:
        q = q.contiguous()
    _score_pages_kernel[(bsz * hkv, n_chunks)](
        q, q.stride(0), q.stride(1),
        summaries.mu, summaries.mu_scale, summaries.basis, summaries.coef, summaries.coef_scale,
        req_to_token, req_to_token.stride(0), req_pool_indices, seq_lens,
        *((seq_lens, seq_lens) if candidates is None else (candidates[0], candidates[1])), n_cand,
        scores if estimates is None else estimates,
        scores, part_max, part_sum, part_max.shape[-1], first,
        max_pages, n_chunks, sm_scale * LOG2E,
        HKV=hkv, G=group, GQ=padded, D=d, R=used, RS=rank, RP=rank_p, PAGE=16,
        BLOCK_P=block_pages,
        QUANT=summaries.quantized, CVT=0 if interpreted() else CONVERSIONS[int_conversion],
        IDOT=idot, GP=max(16, 2 * padded) if idot else 16, TERMS=TERMS[terms],
        BIG=summaries.basis.numel() >= 2**31,  # 64-bit offsets only where 32 bits would overflow
        num_warps=num_warps, num_stages=pipeline_stages(summaries, block_pages, rank_p if used else 0, num_stages,
                                                          _shared_memory_per_block(q.device)),
        **({"maxnreg": maxnreg} if maxnreg else {}),
    )
    return scores, part_max, part_sum


def int8_query(q: torch.Tensor) -> torch.Tensor:
    """q as score_pages_gluon_heads rounds it for the basis term: s * floor(q / s + 1/2) per head, s = max|q| / 127
    (float64; the kernel's float32 divisions may round an element within ~1e-5 of a half step the other way)."""
    q = q.double()
    s = q.abs().amax(-1, keepdim=True) / 127
    s = torch.where(s > 0, s, torch.ones_like(s))
    return s * torch.floor(q / s + 0.5)


def score_pages_torch(q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale, terms="full",
                      estimate_rank=0, basis_q=None):
    """Reference in the dtype of q (use float64 q for a float64 reference) of the "full" and
    "estimate" launches. Returns scores only. basis_q: the query of the basis term (q . V) where a
    kernel rounds it (int8_query), q itself by default."""
    bsz, hq, d = q.shape
    hkv = summaries.num_kv_heads
    group = hq // hkv
    p = torch.arange(max_pages, device=q.device)
    n_sealed = seq_lens.long() // 16
    valid = p[None, :] < n_sealed[:, None]  # [B, P]
    slots = req_to_token[req_pool_indices.long()][:, : max_pages * 16 : 16]
    slots = torch.nn.functional.pad(slots, (0, max_pages - slots.shape[1]))
    page_ids = torch.where(valid, slots.long() // 16, 0)
    mu, basis, coef = (t.to(q.dtype) for t in summaries.dequantize(page_ids))  # [B, P, H, ...]
    qg = q.view(bsz, hkv, group, d)
    qmu = torch.einsum("bhgd,bphd->bhgp", qg, mu)
    ranks = estimate_rank if terms == "estimate" else basis.shape[-2]
    # No ranks: every per-key term is 0, so the page scores q . mu + log 16 (its keys on the centroid).
    qb = qg if basis_q is None else basis_q.to(q.dtype).view(bsz, hkv, group, d)
    proj = torch.einsum("bhgd,bphrd->bhgpr", qb, basis[..., :ranks, :])
    local = torch.einsum("bhgpr,bphir->bhgpi", proj, coef[..., :ranks])
    s = torch.logsumexp((qmu[..., None] + local) * sm_scale, -1)
    s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
    return s.reshape(bsz, hq, max_pages)
