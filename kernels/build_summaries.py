"""build_summaries: page summaries straight from the KV cache, every layer in one launch.

One program per (page, KV head, layer) gathers the page's 16 keys through its
token slots and does what summaries.summarize_pages + quantize_summary (the
torch reference) do: centroid, Gram matrix of the centred keys and its
eigendecomposition (page_eigh's float64 Jacobi), the top-r basis rows
(directions below 1e-6 of the largest singular value zeroed), their
coefficients; for int8-int4-int8 the centroid and basis quantised and the
coefficients refitted by least squares in the quantised basis (its r x r Gram
matrix, made invertible by a unit diagonal on zero rows, inverted by
Gauss-Jordan elimination) before their own quantisation. Rounding is half
away from zero (torch rounds ties to even: a quantised value can differ by one
step on an exact tie).

Why: the torch path is ~50 small ops per call, host time that a decode step
sealing pages would pay every 16 tokens; this is one launch, and no host round
trip.

fp8 caches (SGLang's --kv-cache-dtype fp8_e4m3) hold key / k_scale as
float8_e4m3fn, with one scalar k_scale per layer: the kernel summarises the
dequantised keys (each float32 key times its layer's k_scale, as the torch
path's fp8.float() * k_scale), so summaries and scores stay in the units of
the model's keys.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch
import triton
import triton.language as tl

from .page_eigh import MAX_SWEEPS, _TOL, descending_position, jacobi_eigh


@triton.jit
def _round(x):
    return tl.where(x >= 0, tl.floor(x + 0.5), -tl.floor(0.5 - x))


@triton.jit
def _dot_nt(a, b):
    """a [16, K] b^T in float32 FMAs (IEEE, not TF32): the precision the torch path's quantisation
    works in (Triton 3.6's float64 dots reject operands derived from 16-bit loads)."""
    return tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee").to(tl.float64)


@triton.jit
def _spd_inverse(g):
    """Inverse of a 16 x 16 symmetric positive definite matrix by Gauss-Jordan elimination
    (no pivoting needed: the pivots of an SPD matrix stay positive), 16 steps, no host round trip."""
    i = tl.arange(0, 16)
    inv = tl.where(i[:, None] == i[None, :], 1.0, 0.0).to(tl.float64)
    for p in range(16):
        at_p = i == p
        g_row = tl.sum(tl.where(at_p[:, None], g, 0.0), 0)
        inv_row = tl.sum(tl.where(at_p[:, None], inv, 0.0), 0)
        pivot = tl.sum(tl.where(at_p, g_row, 0.0), 0)
        g_row = g_row / pivot
        inv_row = inv_row / pivot
        factor = tl.where(at_p, 0.0, tl.sum(tl.where(at_p[None, :], g, 0.0), 1))  # column p, row p excluded
        g = tl.where(at_p[:, None], g_row[None, :], g - factor[:, None] * g_row[None, :])
        inv = tl.where(at_p[:, None], inv_row[None, :], inv - factor[:, None] * inv_row[None, :])
    return inv


@triton.jit
def _to_out(x, out: tl.constexpr):
    """x as out (float32 or bfloat16), through float32, rounding to nearest even as torch does
    (by integer ops: Triton's interpreter truncates to bfloat16)."""
    y = x.to(tl.float32)
    if out == tl.bfloat16:
        bits = y.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        y = bits.to(tl.float32, bitcast=True)
    return y.to(out)


@triton.jit
def _key(x, k_scale, SCALED: tl.constexpr):
    """Cached keys x as float32, times the layer's k_scale where the cache holds keys / k_scale: the
    torch path's fp8.float() * k_scale, rounded alike."""
    x = x.to(tl.float32)
    if SCALED:
        x = x * k_scale
    return x


@triton.jit(do_not_specialize=["stride_tok", "n_pages"])  # one compiled kernel for every batch
def _build_summaries_kernel(
    k0_ptr, layer_off_ptr, k_scale_ptr, stride_tok, slots_ptr, rows_ptr, n_pages,
    mu_ptr, mu_scale_ptr, basis_ptr, coef_ptr, coef_scale_ptr,
    HKV: tl.constexpr, D: tl.constexpr, R: tl.constexpr, QUANT: tl.constexpr, RANK_EPS2: tl.constexpr,
    MAX_SWEEPS: tl.constexpr, TOL: tl.constexpr, SCALED: tl.constexpr,
):
    pid = tl.program_id(0)
    layer = tl.program_id(1)
    j = pid // HKV  # page of this call
    h = pid % HKV
    HALF: tl.constexpr = D // 2
    i = tl.arange(0, 16)  # key of the page; eigen index; basis row
    k = tl.arange(0, HALF)
    eye = i[:, None] == i[None, :]

    # Keys as two halves (elements k and k + d/2: the int4 packing's pairs); float64 where sums
    # cancel (centroid, Gram matrix, basis), float32 (exact for 16-bit and unscaled fp8 keys) to hold.
    slots = tl.load(slots_ptr + j * 16 + i).to(tl.int64)
    key_base = k0_ptr + tl.load(layer_off_ptr + layer)
    k_scale = tl.load(k_scale_ptr + layer) if SCALED else 1.0
    page_keys = key_base + h * D + slots * stride_tok  # [16] pointers: element 0 of each key
    x_ptr = page_keys[:, None] + k[None, :]
    x_lo = _key(tl.load(x_ptr), k_scale, SCALED)
    x_hi = _key(tl.load(x_ptr + HALF), k_scale, SCALED)
    mu_lo = tl.sum(x_lo.to(tl.float64), 0) / 16
    mu_hi = tl.sum(x_hi.to(tl.float64), 0) / 16

    # Gram matrix of the centred keys by rank-1 updates over the columns, in float64 (Triton's
    # float64 dots reject operands converted from 16-bit loads); its eigenvectors sorted by
    # descending eigenvalue (column r: the r-th).
    gram = tl.zeros((16, 16), tl.float64)
    for c in range(D):
        col = _key(tl.load(page_keys + c), k_scale, SCALED).to(tl.float64)
        col -= tl.sum(col, 0) / 16
        gram += col[:, None] * col[None, :]
    lam, u = jacobi_eigh(gram, MAX_SWEEPS, TOL)
    to_rank = tl.where(descending_position(lam)[:, None] == i[None, :], 1.0, 0.0).to(tl.float64)
    u = tl.dot(u, to_rank)
    lam = tl.sum(to_rank * lam[:, None], 0)
    keep = (lam > RANK_EPS2 * tl.maximum(tl.max(lam, 0), 1e-300)) & (i < R)
    inv_sqrt = tl.where(keep, 1.0 / tl.sqrt(tl.maximum(lam, 1e-300)), 0.0)
    # Basis rows U^T (x - mu) / sqrt(lam), [16 (r), d/2] per half, by rank-1 updates over the keys.
    b_lo = tl.zeros((16, HALF), tl.float64)
    b_hi = tl.zeros((16, HALF), tl.float64)
    for key in range(16):
        u_key = tl.sum(tl.where(i[:, None] == key, u, 0.0), 0) * inv_sqrt  # row `key` of U, scaled
        at = tl.sum(tl.where(i == key, slots, 0), 0) * stride_tok + h * D
        b_lo += u_key[:, None] * (_key(tl.load(key_base + at + k), k_scale, SCALED).to(tl.float64) - mu_lo)[None, :]
        b_hi += u_key[:, None] * (_key(tl.load(key_base + at + HALF + k), k_scale, SCALED).to(tl.float64)
                                  - mu_hi)[None, :]
    # The rest in float32, as the torch path's quantisation.
    b_lo = b_lo.to(tl.float32)
    b_hi = b_hi.to(tl.float32)
    mu_lo = mu_lo.to(tl.float32)
    mu_hi = mu_hi.to(tl.float32)

    row = tl.load(rows_ptr + layer * n_pages + j).to(tl.int64)
    rec = row * HKV + h
    live = i < R
    if QUANT:
        mu_s = tl.maximum(tl.maximum(tl.max(tl.abs(mu_lo), 0), tl.max(tl.abs(mu_hi), 0)), 1e-12) / 127
        mq_lo = tl.minimum(tl.maximum(_round(mu_lo / mu_s), -127.0), 127.0)
        mq_hi = tl.minimum(tl.maximum(_round(mu_hi / mu_s), -127.0), 127.0)
        v_s = tl.maximum(tl.maximum(tl.max(tl.abs(b_lo), 1), tl.max(tl.abs(b_hi), 1)), 1e-12) / 7
        vq_lo = tl.minimum(tl.maximum(_round(b_lo / v_s[:, None]), -7.0), 7.0)
        vq_hi = tl.minimum(tl.maximum(_round(b_hi / v_s[:, None]), -7.0), 7.0)
        vh_lo = vq_lo * v_s[:, None]
        vh_hi = vq_hi * v_s[:, None]
        # Least squares in the quantised basis, around the quantised centroid:
        # coef (V^ V^T) = (x - mu^) V^T.
        e_lo = x_lo - (mq_lo * mu_s)[None, :]
        e_hi = x_hi - (mq_hi * mu_s)[None, :]
        rhs = _dot_nt(e_lo, vh_lo) + _dot_nt(e_hi, vh_hi)  # [16 keys, 16 r]
        g = _dot_nt(vh_lo, vh_lo) + _dot_nt(vh_hi, vh_hi)
        g += tl.where(eye & (g == 0.0), 1.0, 0.0)
        coef = tl.dot(rhs, _spd_inverse(g))
        c_s = tl.maximum(tl.max(tl.abs(coef), 0), 1e-12) / 127  # per r
        cq = tl.minimum(tl.maximum(_round(coef / c_s[None, :]), -127.0), 127.0)

        tl.store(mu_ptr + rec * D + k, mq_lo.to(tl.int8))
        tl.store(mu_ptr + rec * D + HALF + k, mq_hi.to(tl.int8))
        tl.store(mu_scale_ptr + rec, mu_s.to(tl.float32))
        packed = (vq_lo.to(tl.int32) & 15) | ((vq_hi.to(tl.int32) & 15) << 4)
        tl.store(basis_ptr + (rec * R + i[:, None]) * HALF + k[None, :], packed.to(tl.uint8), mask=live[:, None])
        tl.store(coef_ptr + (rec * R + i[None, :]) * 16 + i[:, None], cq.to(tl.int8), mask=live[None, :])
        tl.store(coef_scale_ptr + rec * R + i, (v_s * c_s).to(tl.float32), mask=live)
    else:
        coef = _dot_nt(x_lo - mu_lo[None, :], b_lo) + _dot_nt(x_hi - mu_hi[None, :], b_hi)  # [16 keys, 16 r]
        out: tl.constexpr = mu_ptr.dtype.element_ty
        tl.store(mu_ptr + rec * D + k, _to_out(mu_lo, out))
        tl.store(mu_ptr + rec * D + HALF + k, _to_out(mu_hi, out))
        b_ptr = basis_ptr + (rec * R + i[:, None]) * D + k[None, :]
        tl.store(b_ptr, _to_out(b_lo, out), mask=live[:, None])
        tl.store(b_ptr + HALF, _to_out(b_hi, out), mask=live[:, None])
        tl.store(coef_ptr + (rec * R + i[None, :]) * 16 + i[:, None], _to_out(coef, out), mask=live[None, :])


_OFFSETS: Dict[tuple, torch.Tensor] = {}


def _layer_offsets(key_buffers: Sequence[torch.Tensor]) -> torch.Tensor:
    """Element offsets of each buffer from the first, on the device (a server's layers keep their
    buffers: computed once per set)."""
    k0 = key_buffers[0]
    key = (k0.device, *(b.data_ptr() for b in key_buffers))
    if key not in _OFFSETS:
        size = k0.element_size()
        _OFFSETS[key] = torch.tensor([(b.data_ptr() - k0.data_ptr()) // size for b in key_buffers],
                                     dtype=torch.int64, device=k0.device)
    return _OFFSETS[key]


def head_dim_reason(head_dim: int) -> Optional[str]:
    """Why the summary and score kernels cannot take head_dim (they tile half a head: a power of two >= 16),
    or None."""
    half = head_dim // 2
    if head_dim % 2 or half < 16 or half & (half - 1):
        return f"head_dim {head_dim} (head_dim / 2 must be a power of two >= 16: 32, 64, 128, 256, ...)"
    return None


# The key dtypes the summary builds read: SGLang's 16-bit caches, float32 (tests, offline keys) and
# --kv-cache-dtype fp8_e4m3's float8_e4m3fn; other fp8 formats (e5m2, the fnuz ones) are refused.
KEY_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn)


def key_dtype_reason(dtype: torch.dtype) -> Optional[str]:
    """Why the summary builds (kernel and torch path) cannot read keys of dtype, or None."""
    if dtype not in KEY_DTYPES:
        return f"key cache dtype {dtype} (supported: {', '.join(str(t) for t in KEY_DTYPES)})"
    return None


def check_k_scales(k_scales: Optional[torch.Tensor], key_buffers: Sequence[torch.Tensor]) -> None:
    """k_scales: None, or float32 [layers] on the buffers' device, one scale per key buffer."""
    if k_scales is None:
        return
    if (k_scales.dtype != torch.float32 or k_scales.dim() != 1 or k_scales.numel() != len(key_buffers)
            or (key_buffers and k_scales.device != key_buffers[0].device)):
        raise ValueError(f"k_scales must be float32 [{len(key_buffers)}] (one per key buffer) on the key buffers' "
                         f"device, got {k_scales.dtype} {tuple(k_scales.shape)} on {k_scales.device}")


def unsupported_reason(summaries, key_buffers: Sequence[torch.Tensor]) -> Optional[str]:
    """Why build_summaries_triton cannot summarise from these key buffers, or None: the kernel
    tiles half a head (head_dim / 2 a power of two >= 16), rank <= 16, and every layer's buffer
    is [tokens, H_kv, head_dim] with contiguous heads, one dtype of KEY_DTYPES and one set of strides."""
    k0 = key_buffers[0]
    reason = head_dim_reason(k0.shape[-1]) or key_dtype_reason(k0.dtype)
    if reason:
        return reason
    if summaries.rank > 16:
        return f"rank {summaries.rank} > 16"
    if k0.dim() != 3 or k0.stride(2) != 1 or k0.stride(1) != k0.shape[2]:
        return "key buffers must be [tokens, H_kv, head_dim] with contiguous heads"
    if any(b.dtype != k0.dtype or b.stride() != k0.stride() or b.shape[1:] != k0.shape[1:] for b in key_buffers):
        return "key buffers must share dtype, shape and strides"
    return None


def build_summaries_triton(summaries, rows: torch.Tensor, key_buffers: Sequence[torch.Tensor], slots: torch.Tensor,
                           rank_eps: float, k_scales: Optional[torch.Tensor] = None) -> None:
    """Summarise the pages whose token slots are slots [n, 16] in every buffer of key_buffers (each
    [tokens, H_kv, d], one per layer, same dtype and strides) into summaries rows rows [layers, n].

    k_scales: None (the buffers hold the keys), or float32 [layers] on the device (buffer l holds
    keys / k_scales[l], as SGLang's fp8 cache): read by the kernel, so a fixed tensor serves every
    build without a host round trip."""
    n = slots.shape[0]
    if n == 0 or not key_buffers:
        return
    reason = unsupported_reason(summaries, key_buffers)
    if reason:
        raise ValueError(f"build_summaries_triton: {reason}")
    check_k_scales(k_scales, key_buffers)
    k0 = key_buffers[0]
    h, d = k0.shape[1], k0.shape[2]
    s = summaries
    offsets = _layer_offsets(key_buffers)
    _build_summaries_kernel[(n * h, len(key_buffers))](
        k0, offsets, offsets if k_scales is None else k_scales.contiguous(),  # not read without scales
        k0.stride(0), slots.contiguous(), rows.contiguous(), n,
        s.mu, s.mu_scale, s.basis, s.coef, s.coef_scale,
        HKV=h, D=d, R=s.rank, QUANT=s.quantized, RANK_EPS2=rank_eps**2, MAX_SWEEPS=MAX_SWEEPS, TOL=_TOL,
        SCALED=k_scales is not None, num_warps=4,
    )
