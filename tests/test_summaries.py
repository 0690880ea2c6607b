import pytest
import torch

from sglang_locks.summaries import (
    PageSummaries, pack_int4, quantize_summary, summarize_pages, summarize_pages_reference, unpack_int4,
)


def _low_rank_pages(n, d, true_rank, gen):
    mu = 3 * torch.randn(n, 1, d, generator=gen)
    basis = torch.linalg.qr(torch.randn(n, d, true_rank, generator=gen)).Q.transpose(1, 2)
    coef = torch.randn(n, 16, true_rank, generator=gen) * torch.linspace(4, 1, true_rank)
    return mu + coef @ basis + 0.01 * torch.randn(n, 16, d, generator=gen)


def test_reference_is_the_svd_definition():
    gen = torch.Generator().manual_seed(1)
    keys = torch.randn(5, 16, 40, generator=gen, dtype=torch.float64)
    mu, basis, coef = summarize_pages_reference(keys, 8)
    assert torch.allclose(mu, keys.mean(1))
    dev = keys - mu[:, None]
    # Orthonormal rows spanning the top-8 right singular subspace: Eckart-Young optimum.
    assert torch.allclose(basis @ basis.transpose(1, 2), torch.eye(8, dtype=torch.float64).expand(5, 8, 8), atol=1e-10)
    s = torch.linalg.svdvals(dev)
    resid = (dev - coef @ basis).square().sum((1, 2))
    assert torch.allclose(resid, s[:, 8:].square().sum(1), rtol=1e-8)


@pytest.mark.parametrize("rank", [1, 4, 8, 15])
@pytest.mark.parametrize("d", [64, 128, 130])
def test_gram_path_matches_reference(rank, d, device):
    gen = torch.Generator().manual_seed(rank * 1000 + d)
    keys = _low_rank_pages(37, d, 6, gen)
    mu_r, basis_r, coef_r = summarize_pages_reference(keys, rank)
    mu, basis, coef = (t.cpu().double() for t in summarize_pages(keys.to(device), rank))
    assert torch.allclose(mu, mu_r, atol=1e-5)
    dev = keys.double() - mu_r[:, None]
    err_fast = (dev - coef @ basis).norm() / dev.norm()
    err_ref = (dev - coef_r @ basis_r).norm() / dev.norm()
    assert err_fast <= err_ref + 1e-4
    # Same scores, whatever the sign/rotation of the basis within the subspace.
    q = torch.randn(37, d, dtype=torch.float64, generator=gen)

    def s(m, b, c):
        proj = (b @ q[..., None])  # [n, r, 1]
        return torch.logsumexp((q * m).sum(-1)[:, None] + (c @ proj)[..., 0], -1)

    assert torch.allclose(s(mu, basis, coef), s(mu_r, basis_r, coef_r), atol=1e-3)


def test_degenerate_page_has_no_nan(device):
    keys = torch.ones(3, 16, 64, device=device)
    keys[1, :8] = 2.0  # rank-1 page
    mu, basis, coef = summarize_pages(keys, 8)
    assert torch.isfinite(basis).all() and torch.isfinite(coef).all()
    assert torch.allclose((mu[:, None] + coef @ basis), keys, atol=1e-5)


def test_int4_pack_roundtrip():
    gen = torch.Generator().manual_seed(0)
    v = torch.randint(-8, 8, (7, 3, 128), generator=gen, dtype=torch.int8)
    packed = pack_int4(v)
    assert packed.shape == (7, 3, 64) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), v)


def test_quantisation_error_bounds():
    gen = torch.Generator().manual_seed(3)
    keys = _low_rank_pages(64, 128, 6, gen)
    mu, basis, _ = summarize_pages_reference(keys, 8)
    mu_q, mu_s, basis_q, coef_q, coef_s = quantize_summary(keys, mu, basis)
    mu_hat = mu_q.float() * mu_s[:, None]
    # int8 absmax: error at most half a step per element.
    assert ((mu_hat - mu.float()).abs() <= mu_s[:, None] / 2 + 1e-6).all()
    rec = mu_hat[:, None] + (coef_q.float() * coef_s[:, None]) @ unpack_int4(basis_q).float()
    rel = ((rec - keys).norm(dim=-1) / (keys - mu[:, None].float()).norm(dim=-1)).mean()
    # int4 basis rows (step = absmax/7) reconstruct the deviations to well under 20 %.
    assert rel < 0.2, rel


def test_storage_size_and_layout():
    s = PageSummaries.allocate(10, 8, 128, 8, "int8-int4-int8")
    assert s.bytes_per_page_per_head() == 128 + 4 + 8 * 64 + 16 * 8 + 4 * 8 == 804
    assert s.bytes_per_page_per_head() / (16 * 128 * 2 * 2) < 0.1
    assert PageSummaries.allocate(1, 1, 128, 8, "fp32").bytes_per_page_per_head() == 4 * (128 + 1 + 8 * 128 + 16 * 8 + 8)
    with pytest.raises(ValueError, match="summary_precision"):
        PageSummaries.allocate(1, 1, 128, 8, "int2")


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8-int4-int8"])
def test_write_then_dequantize_reconstructs(precision, device):
    gen = torch.Generator().manual_seed(4)
    keys = _low_rank_pages(12 * 2, 128, 5, gen).view(12, 2, 16, 128).transpose(1, 2)  # [n, 16, H, d]
    s = PageSummaries.allocate(20, 2, 128, 8, precision, device)
    ids = torch.randperm(20, generator=gen)[:12].to(device)
    s.write(ids, keys.to(device))
    mu, basis, coef = (t.cpu() for t in s.dequantize(ids))
    rec = mu[:, :, None] + coef @ basis  # [n, H, 16, d]
    dev = keys.transpose(1, 2) - keys.transpose(1, 2).mean(2, keepdim=True)
    tol = {"fp32": 0.02, "bf16": 0.03, "int8-int4-int8": 0.2}[precision]  # noise floor ~1.2 %
    assert ((rec - keys.transpose(1, 2)).norm() / dev.norm()) < tol
