"""page_eigh (batched 16x16 Jacobi, float64) against torch.linalg.eigh; the summary build never syncs."""

import pytest
import torch

from sglang_locks.kernels.page_eigh import page_eigh_torch, page_eigh_triton
from sglang_locks.summaries import PageSummaries


def _grams(n, device, seed):
    """Gram matrices of centred 16 x 128 pages, spectra from flat to 12 decades, plus degenerate ones."""
    gen = torch.Generator().manual_seed(seed)
    decay = torch.logspace(0, -6, 16, dtype=torch.float64) ** torch.rand(n, 1, generator=gen, dtype=torch.float64)
    x = torch.randn(n, 16, 128, generator=gen, dtype=torch.float64) * (3 * decay[..., None])
    x = x - x.mean(1, keepdim=True)
    g = x @ x.transpose(1, 2)
    g[0] = 0.0                                   # an empty page (all keys equal)
    g[1] = 2.5 * torch.eye(16)                   # a 16-fold eigenvalue
    v = torch.randn(16, 2, generator=gen, dtype=torch.float64)
    g[2] = v @ v.T                               # rank 2
    return g.to(device)


def _check(g, lam, u):
    lam_r, _ = page_eigh_torch(g)
    scale = g.flatten(1).norm(dim=1).clamp_min(1e-300)[:, None]
    assert ((lam - lam_r).abs() / scale).max() < 1e-12
    assert (lam[:, :-1] >= lam[:, 1:]).all()
    eye = torch.eye(16, dtype=torch.float64, device=g.device)
    assert (u.transpose(1, 2) @ u - eye).abs().max() < 1e-10
    rec = u @ torch.diag_embed(lam) @ u.transpose(1, 2)
    assert ((rec - g).flatten(1).norm(dim=1) / scale[:, 0]).max() < 1e-12


def test_page_eigh_kernel_matches_eigh(device):
    g = _grams(7, device, seed=1)  # few matrices: on CPU the kernel runs in Triton's interpreter
    lam, u = page_eigh_triton(g)
    assert lam.dtype == u.dtype == torch.float64
    _check(g, lam, u)


def test_page_eigh_rejects_other_shapes():
    with pytest.raises(ValueError, match=r"\[n, 16, 16\]"):
        page_eigh_triton(torch.zeros(2, 8, 8))


@pytest.mark.gpu
def test_page_eigh_kernel_many_pages():
    g = _grams(5003, "cuda", seed=2)
    _check(g, *page_eigh_triton(g))


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["int8-int4-int8", "fp32"])
def test_summary_build_does_not_wait_for_the_gpu(precision):
    """Decode-sealed pages are summarised while earlier steps still run: no op may wait for them.
    A ~1 s GPU sleep is queued first; after write() returns, the GPU must still be busy."""
    keys = torch.randn(37, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    s = PageSummaries.allocate(64, 8, 128, 8, precision, "cuda")
    ids = torch.randperm(64, device="cuda")[:37]
    s.write(ids, keys)  # warm-up: one-off allocations and kernel compilation
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # GPU cycles: ~1 s
    s.write(ids, keys)
    still_busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert still_busy, "PageSummaries.write waited for the GPU"
