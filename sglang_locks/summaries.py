"""Per-page key summaries: centroid, page-local basis and per-key coefficients.

A sealed 16-token page of keys K (per layer and KV head) is summarised as

    mu = mean(K),   V = top-r right singular vectors of K - mu  (r x d),
    C  = (K - mu) V^T  (16 x r),

so that K ~ mu + C V and a query's logits are q.mu + (V q).c_i.

Storage (``PageSummaries``), per page and KV head, for precision
``int8-int4-int8`` and head_dim d, rank r (d=128, r=8: 804 bytes against
16*d*2*2 = 8192 bytes of K+V, 9.8 %):

    mu         int8  [d]        mu ~ mu_scale * mu_q           (d bytes)
    mu_scale   fp32  []                                         (4 bytes)
    basis      uint8 [r, d/2]   int4 two's complement: byte k holds element k
                                in its low nibble and element k + d/2 in its
                                high nibble (so a kernel multiplies the two
                                halves of q without interleaving)  (r*d/2 bytes)
    coef       int8  [r, 16]    r-major: one coefficient of all 16 keys is one
                                16-byte vector for the scoring kernel  (16*r bytes)
    coef_scale fp32  [r]        basis-row scale x coef-column scale, so that
                                (V q).c_i = sum_r coef_scale_r (V_q,r . q) coef_q,ir
                                                                (4*r bytes)

Quantisation is error-compensating: mu and V are quantised first, then C is the
least-squares fit of the centred keys in the *quantised* basis, so the
quantised summary reconstructs K as well as it can.
Precisions ``fp32`` and ``bf16`` store mu/basis/coef as floats with unit scales.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

import torch

from .config import PAGE_SIZE, SUMMARY_PRECISIONS
from .kernels._triton import triton_usable
from .kernels.build_summaries import build_summaries_triton, check_k_scales, key_dtype_reason, unsupported_reason
from .kernels.page_eigh import page_eigh_torch, page_eigh_triton

# Singular values below this fraction of the page's largest carry no signal
# (repeated tokens, padding); their basis rows are zeroed instead of amplifying noise.
_RANK_EPS = 1e-6
# Pages per batched build call: bounds the float64 temporaries (16 x d per page).
_SOLVER_BATCH = 8192
# write_from_cache: (page, KV head, layer) triples up to which the one-launch kernel builds them.
_BUILD_KERNEL_MAX_PROGRAMS = 1024


def _check_keys(keys: torch.Tensor, rank: int) -> None:
    if keys.dim() != 3 or keys.shape[1] != PAGE_SIZE:
        raise ValueError(f"keys must be [pages, {PAGE_SIZE}, head_dim], got {tuple(keys.shape)}")
    if not 1 <= rank <= PAGE_SIZE:
        raise ValueError(f"rank must be in [1, {PAGE_SIZE}], got {rank}")
    if keys.shape[2] % 2:
        raise ValueError(f"head_dim must be even (int4 packing), got {keys.shape[2]}")


def summarize_pages_reference(keys: torch.Tensor, rank: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float64 SVD reference. keys [n, 16, d] -> mu [n, d], basis [n, r, d], coef [n, 16, r]."""
    _check_keys(keys, rank)
    x = keys.double()
    mu = x.mean(1)
    dev = x - mu[:, None]
    _, s, vh = torch.linalg.svd(dev, full_matrices=False)
    r = min(rank, vh.shape[1])
    basis = vh[:, :r] * (s[:, :r] > _RANK_EPS * s[:, :1].clamp_min(1e-300))[..., None]
    basis = _pad_rank(basis, rank)
    return mu, basis, dev @ basis.transpose(1, 2)


def _pad_rank(basis: torch.Tensor, rank: int) -> torch.Tensor:
    """Rank may exceed min(16, d); missing rows are zeros."""
    if basis.shape[1] == rank:
        return basis
    pad = basis.new_zeros(basis.shape[0], rank - basis.shape[1], basis.shape[2])
    return torch.cat([basis, pad], 1)


def summarize_pages(keys: torch.Tensor, rank: int, chunk: int = _SOLVER_BATCH) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fast path through the 16x16 Gram matrix of each page, float32 out.

    Eigenvectors U of G = X X^T (X the centred keys) give V = U^T X / sqrt(lambda)
    and C = U sqrt(lambda): one batched 16x16 eigendecomposition instead of a
    16 x d SVD per page. Gram and eigh run in float64 (float32 squares the
    condition number and loses the weaker directions), in chunks (bounded
    temporaries). On CUDA the eigendecomposition is page_eigh's kernel, which
    unlike torch.linalg.eigh never waits for the GPU: nothing in a build syncs
    with the host.
    """
    _check_keys(keys, rank)
    out = [_summarize_chunk(keys[i : i + chunk], rank) for i in range(0, max(1, keys.shape[0]), chunk)]
    return tuple(torch.cat(parts) for parts in zip(*out))


def _summarize_chunk(keys: torch.Tensor, rank: int):
    x = keys.double()
    mu = x.mean(1)
    dev = x - mu[:, None]
    gram = dev @ dev.transpose(1, 2)
    lam, u = page_eigh_triton(gram) if gram.is_cuda else page_eigh_torch(gram)  # largest first
    r = min(rank, PAGE_SIZE)
    lam, u = lam[:, :r], u[..., :r]
    keep = lam > _RANK_EPS**2 * lam[:, :1].clamp_min(1e-300)
    inv_sqrt = torch.where(keep, lam.clamp_min(1e-300).rsqrt(), torch.zeros_like(lam))
    basis = _pad_rank((u.transpose(1, 2) @ dev) * inv_sqrt[..., None], rank)
    return mu.float(), basis.float(), (dev @ basis.transpose(1, 2)).float()


def cached_keys(buf: torch.Tensor, slots: torch.Tensor,
                k_scale: Union[torch.Tensor, float, None] = None) -> torch.Tensor:
    """The keys at slots of a cached key buffer, as the build kernel reads them: fp8 keys gathered
    as bytes (not every indexing kernel takes fp8: SGLang keeps its fp8 pools as uint8) and widened
    to float32; times k_scale (a device scalar or a float: the buffer holds keys / k_scale) in
    float32 where given; other keys as they are."""
    if buf.dtype == torch.float8_e4m3fn:
        keys = buf.view(torch.uint8)[slots].view(buf.dtype).float()
    else:
        keys = buf[slots]
    return keys if k_scale is None else keys.float() * k_scale


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """int values in [-8, 7], last dim d (even) -> uint8 [..., d/2] (low: k, high: k + d/2)."""
    half = values.shape[-1] // 2
    lo = values[..., :half].to(torch.int32) & 15
    hi = values[..., half:].to(torch.int32) & 15
    return (lo | (hi << 4)).to(torch.uint8)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_int4, as int8 in [-8, 7]."""
    p = packed.to(torch.int32)
    lo = ((p & 15) ^ 8) - 8
    hi = (((p >> 4) & 15) ^ 8) - 8
    return torch.cat([lo, hi], -1).to(torch.int8)


def _absmax_scale(x: torch.Tensor, qmax: int, dim: int) -> torch.Tensor:
    return x.abs().amax(dim, keepdim=True).clamp_min(1e-12) / qmax


def quantize_summary(
    keys: torch.Tensor, mu: torch.Tensor, basis: torch.Tensor
) -> Tuple[torch.Tensor, ...]:
    """Quantise (mu, basis) and refit C in the quantised basis.

    Returns mu_q int8 [n, d], mu_scale [n], basis_q uint8 [n, r, d/2],
    coef_q int8 [n, 16, r], coef_scale [n, r].
    """
    x = keys.float()
    mu_s = _absmax_scale(mu.float(), 127, -1)
    mu_q = torch.round(mu.float() / mu_s).clamp(-127, 127)
    v_s = _absmax_scale(basis.float(), 7, -1)  # per basis row
    v_q = torch.round(basis.float() / v_s).clamp(-7, 7)
    v_hat = v_q * v_s
    dev = x - (mu_q * mu_s)[:, None]
    # Least squares c = argmin |dev - c v_hat|: c (v_hat v_hat^T) = dev v_hat^T. Zero basis rows
    # (rank-deficient pages) get a unit diagonal, hence zero coefficients, as a pseudo-inverse
    # would give; solve_ex, unlike pinv, does not check for errors on the host (no sync).
    gram = (v_hat @ v_hat.transpose(1, 2)).double()
    gram = gram + torch.diag_embed((torch.diagonal(gram, dim1=-2, dim2=-1) == 0).double())
    coef = torch.linalg.solve_ex(gram, (dev @ v_hat.transpose(1, 2)).double(), left=False)[0].float()
    c_s = _absmax_scale(coef, 127, 1)  # per coefficient column
    coef_q = torch.round(coef / c_s).clamp(-127, 127)
    return (
        mu_q.to(torch.int8),
        mu_s.squeeze(-1),
        pack_int4(v_q.to(torch.int8)),
        coef_q.to(torch.int8),
        (v_s.squeeze(-1) * c_s.squeeze(1)),
    )


@dataclass
class PageSummaries:
    """Summaries of one layer's pages, indexed by physical page id: [pages, H_kv, ...]."""

    mu: torch.Tensor
    mu_scale: torch.Tensor
    basis: torch.Tensor
    coef: torch.Tensor
    coef_scale: torch.Tensor
    precision: str

    @classmethod
    def allocate(
        cls, num_pages: int, num_kv_heads: int, head_dim: int, rank: int, precision: str, device="cpu"
    ) -> "PageSummaries":
        if precision not in SUMMARY_PRECISIONS:
            raise ValueError(f"summary_precision must be one of {SUMMARY_PRECISIONS}, got {precision!r}")
        if head_dim % 2:
            raise ValueError(f"head_dim must be even, got {head_dim}")
        shape = (num_pages, num_kv_heads)
        if precision == "int8-int4-int8":
            mu = torch.zeros(*shape, head_dim, dtype=torch.int8, device=device)
            basis = torch.zeros(*shape, rank, head_dim // 2, dtype=torch.uint8, device=device)
            coef = torch.zeros(*shape, rank, PAGE_SIZE, dtype=torch.int8, device=device)
        else:
            dtype = torch.float32 if precision == "fp32" else torch.bfloat16
            mu = torch.zeros(*shape, head_dim, dtype=dtype, device=device)
            basis = torch.zeros(*shape, rank, head_dim, dtype=dtype, device=device)
            coef = torch.zeros(*shape, rank, PAGE_SIZE, dtype=dtype, device=device)
        return cls(
            mu=mu,
            mu_scale=torch.ones(shape, dtype=torch.float32, device=device),
            basis=basis,
            coef=coef,
            coef_scale=torch.ones(*shape, rank, dtype=torch.float32, device=device),
            precision=precision,
        )

    @property
    def num_pages(self) -> int:
        return self.mu.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.mu.shape[1]

    @property
    def head_dim(self) -> int:
        return self.mu.shape[2]

    @property
    def rank(self) -> int:
        return self.coef.shape[-2]

    @property
    def quantized(self) -> bool:
        return self.precision == "int8-int4-int8"

    def bytes_per_page_per_head(self) -> int:
        return sum(
            t[0, 0].numel() * t.element_size()
            for t in (self.mu, self.mu_scale, self.basis, self.coef, self.coef_scale)
        )

    def estimate_bytes_per_page_per_head(self, ranks: int) -> int:
        """What an estimate from the centroid and the first ranks ranks reads (the prefilter)."""
        per_rank = sum(t[0, 0].numel() * t.element_size() for t in (self.basis, self.coef, self.coef_scale)) // self.rank
        return sum(t[0, 0].numel() * t.element_size() for t in (self.mu, self.mu_scale)) + ranks * per_rank

    def write(self, page_ids: torch.Tensor, keys: torch.Tensor) -> None:
        """Summarise keys [n, 16, H_kv, d] (token-major, as cached) into pages page_ids [n]."""
        step = max(1, _SOLVER_BATCH // keys.shape[2])
        for i in range(0, keys.shape[0], step):
            self._write(page_ids[i : i + step], keys[i : i + step])

    def write_from_cache(self, rows: torch.Tensor, key_buffers: Sequence[torch.Tensor], slots: torch.Tensor,
                         k_scales: Optional[torch.Tensor] = None) -> None:
        """Summarise the pages whose token slots are slots [n, 16], in each layer's key buffer
        ([tokens, H_kv, d], as cached: bf16, fp16, fp32 or float8_e4m3fn), into rows [layers, n].
        k_scales: None, or float32 [layers] on the device: buffer l holds keys / k_scales[l] (SGLang's
        fp8 cache with the layer's k_scale), and the summaries are those of the dequantised keys.

        Few pages (a decode step's seals): one launch of build_summaries' kernel for all layers
        (where Triton runs and the kernel takes the buffers: see unsupported_reason), ~0.1 ms of
        host time instead of ~2-4 ms for write()'s ~50 small ops. Many (a prefill chunk): write()
        per layer, whose batched torch ops have the higher throughput (a kernel program per page
        and head runs a 16 x 16 float64 eigensolver, at ~2 programs per SM)."""
        reason = key_dtype_reason(key_buffers[0].dtype) if key_buffers else None
        if reason:
            raise ValueError(f"write_from_cache: {reason}")
        check_k_scales(k_scales, key_buffers)
        programs = slots.shape[0] * self.num_kv_heads * len(key_buffers)
        if (key_buffers and programs <= _BUILD_KERNEL_MAX_PROGRAMS and triton_usable(slots.device)
                and unsupported_reason(self, key_buffers) is None):
            build_summaries_triton(self, rows, key_buffers, slots, _RANK_EPS, k_scales)
            return
        for layer, (layer_rows, buf) in enumerate(zip(rows, key_buffers)):
            self.write(layer_rows, cached_keys(buf, slots, None if k_scales is None else k_scales[layer]))

    def _write(self, page_ids: torch.Tensor, keys: torch.Tensor) -> None:
        n, _, h, d = keys.shape
        flat = keys.permute(0, 2, 1, 3).reshape(n * h, PAGE_SIZE, d)
        mu, basis, coef = summarize_pages(flat, self.rank)
        if self.quantized:
            mu_q, mu_s, basis_q, coef_q, coef_s = quantize_summary(flat, mu, basis)
            parts = (mu_q, mu_s, basis_q, coef_q.transpose(1, 2), coef_s)
            targets = (self.mu, self.mu_scale, self.basis, self.coef, self.coef_scale)
        else:
            parts = (mu, basis, coef.transpose(1, 2))
            targets = (self.mu, self.basis, self.coef)
        for dst, src in zip(targets, parts):
            dst[page_ids] = src.reshape(n, h, *src.shape[1:]).to(dst.dtype)

    def dequantize(self, page_ids: torch.Tensor = None):
        """Float32 (mu [.., d], basis [.., r, d], coef [.., 16, r]) with scales applied.

        The coefficient scales are folded into coef, so mu + coef @ basis
        reconstructs the keys the score sees.
        """
        sel = (lambda t: t) if page_ids is None else (lambda t: t[page_ids])
        mu = sel(self.mu).float() * sel(self.mu_scale)[..., None]
        basis = unpack_int4(sel(self.basis)).float() if self.quantized else sel(self.basis).float()
        coef = sel(self.coef).float().transpose(-1, -2) * sel(self.coef_scale)[..., None, :]
        return mu, basis, coef
