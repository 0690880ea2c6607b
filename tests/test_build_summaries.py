"""build_summaries' kernel (summaries straight from the KV cache, all layers in one launch) against
the torch path (summarize_pages + quantize_summary, float64 eigh) on the same pages."""

import pytest
import torch

from sglang_locks.kernels.build_summaries import build_summaries_triton, unsupported_reason
from sglang_locks.summaries import _RANK_EPS, PageSummaries


def _cache(layers, pages, h, d, device, seed):
    """Key buffers [pages * 16, h, d] bf16: low-rank pages plus noise; page 2 holds one repeated key
    (rank 0) and page 3 two distinct keys (rank 1)."""
    gen = torch.Generator().manual_seed(seed)
    bufs = []
    for _ in range(layers):
        mu = 2 * torch.randn(pages, 1, h, d, generator=gen)
        basis = torch.randn(pages, 1, h, 6, d, generator=gen) / d**0.5
        coef = torch.randn(pages, 16, h, 6, 1, generator=gen) * torch.linspace(6, 1, 6)[:, None]
        k = mu + (coef * basis).sum(3) + 0.05 * torch.randn(pages, 16, h, d, generator=gen)
        k[2] = k[2, :1]
        k[3, 8:] = k[3, :1]
        k[3, :8] = k[3, 15:]
        bufs.append(k.reshape(pages * 16, h, d).to(torch.bfloat16).to(device))
    return bufs


def _scores(mu, basis, coef, q):
    """Page log-mass of q [H, d] against dequantised summaries [n, H, ...] (float64)."""
    qmu = torch.einsum("hd,nhd->nh", q, mu)
    local = torch.einsum("nhir,nhrd,hd->nhi", coef, basis, q)
    return torch.logsumexp(qmu[..., None] + local, -1)


@pytest.mark.parametrize("precision, d, rank", [
    ("int8-int4-int8", 128, 8), ("fp32", 128, 8), ("bf16", 128, 8),
    ("int8-int4-int8", 64, 5), ("int8-int4-int8", 32, 16), ("bf16", 32, 16),
])
def test_build_matches_torch_path(precision, d, rank, device):
    layers, pages, h = 2, 6, 2
    bufs = _cache(layers, pages, h, d, device, seed=d + rank)
    page_ids = torch.tensor([4, 2, 0, 3, 5], device=device)  # any order; rank-deficient pages 2, 3
    slots = page_ids[:, None] * 16 + torch.arange(16, device=device)
    rows = torch.stack([page_ids + 7, page_ids]).to(device)  # layer 0 -> rows 7.., layer 1 -> rows 0..
    ref = PageSummaries.allocate(16, h, d, rank, precision, device)
    out = PageSummaries.allocate(16, h, d, rank, precision, device)
    for layer_rows, buf in zip(rows, bufs):
        ref.write(layer_rows, buf[slots])
    build_summaries_triton(out, rows, bufs, slots, _RANK_EPS)

    q = torch.randn(h, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for layer_rows, buf in zip(rows, bufs):
        keys = buf[slots].double().cpu().transpose(1, 2)  # [n, H, 16, d]
        dev = keys - keys.mean(2, keepdim=True)
        s_ref, s_out = ((t.double().cpu() for t in s.dequantize(layer_rows)) for s in (ref, out))
        (mu_r, b_r, c_r), (mu_o, b_o, c_o) = tuple(s_ref), tuple(s_out)
        err_r = (mu_r[:, :, None] + c_r @ b_r - keys).norm()
        err_o = (mu_o[:, :, None] + c_o @ b_o - keys).norm()
        rounding = {"int8-int4-int8": 1e-2, "fp32": 1e-5, "bf16": 4e-3}[precision]  # of the stored values
        assert err_o <= err_r * 1.01 + rounding * dev.norm(), (err_o, err_r)
        tol = {"int8-int4-int8": 0.02, "fp32": 1e-4, "bf16": 0.02}[precision]
        torch.testing.assert_close(_scores(mu_o, b_o, c_o, q), _scores(mu_r, b_r, c_r, q), atol=tol * 10, rtol=tol)
        if precision == "int8-int4-int8":  # the same quantisation grid, up to a step on rounding ties
            assert (out.mu[layer_rows].int() - ref.mu[layer_rows].int()).abs().max() <= 1
            torch.testing.assert_close(out.mu_scale[layer_rows], ref.mu_scale[layer_rows], rtol=1e-5, atol=0)
    untouched = torch.tensor([i for i in range(16) if i not in rows.flatten().tolist()], device=device)
    assert out.mu[untouched].abs().sum() == 0 and out.coef[untouched].abs().sum() == 0


def test_build_rejects_unsupported_inputs():
    s = PageSummaries.allocate(4, 1, 96, 8, "fp32")
    buf = torch.zeros(64, 1, 96)
    assert "head_dim 96" in unsupported_reason(s, [buf])
    with pytest.raises(ValueError, match="head_dim"):
        build_summaries_triton(s, torch.zeros(1, 1, dtype=torch.int64), [buf], torch.zeros(1, 16, dtype=torch.int64),
                               _RANK_EPS)
    s = PageSummaries.allocate(4, 1, 64, 8, "fp32")
    assert unsupported_reason(s, [torch.zeros(64, 1, 64)]) is None
    assert "strides" in unsupported_reason(s, [torch.zeros(64, 1, 64), torch.zeros(64, 2, 64)[:, :1]])
    assert "contiguous heads" in unsupported_reason(s, [torch.zeros(64, 64, 1).transpose(1, 2)])


def test_write_from_cache_falls_back_for_other_head_dims(device):
    """head_dim 96 (half not a power of two): write() per layer, the same summaries as write()."""
    bufs = _cache(2, 4, 1, 96, device, seed=3)
    slots = torch.tensor([[16 * 1 + i for i in range(16)]], device=device)
    rows = torch.tensor([[0], [2]], device=device)
    a = PageSummaries.allocate(3, 1, 96, 8, "int8-int4-int8", device)
    b = PageSummaries.allocate(3, 1, 96, 8, "int8-int4-int8", device)
    a.write_from_cache(rows, bufs, slots)
    for layer_rows, buf in zip(rows, bufs):
        b.write(layer_rows, buf[slots])
    assert torch.equal(a.mu, b.mu) and torch.equal(a.basis, b.basis) and torch.equal(a.coef, b.coef)


@pytest.mark.gpu
def test_build_from_cache_does_not_wait_for_the_gpu():
    """A decode step's seals are built while earlier steps still run: after a ~1 s GPU sleep is
    queued, write_from_cache (32 layers, one launch) returns with the GPU still busy."""
    bufs = _cache(32, 4, 8, 128, "cuda", seed=5)
    s = PageSummaries.allocate(32 * 4, 8, 128, 8, "int8-int4-int8", "cuda")
    slots = torch.arange(16, device="cuda")[None] + 16
    rows = torch.arange(32, device="cuda")[:, None] * 4 + 1
    s.write_from_cache(rows, bufs, slots)  # compile
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)
    s.write_from_cache(rows, bufs, slots)
    still_busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert still_busy, "write_from_cache waited for the GPU"
