"""An fp8 KV cache (SGLang's --kv-cache-dtype fp8_e4m3: float8_e4m3fn holding K / k_scale and V / v_scale, one
scalar scale per layer): the summary builds and the sparse decode equal those over the dequantised cache."""

import os
import subprocess
import sys

import pytest
import torch

from helpers import random_cache
from sglang_locks.config import SPARSE_DECODE_KERNELS
from sglang_locks.kernels.build_summaries import build_summaries_triton
from sglang_locks.kernels.sparse_attend import sparse_attend_triton
from sglang_locks.selection import selected_pages
from sglang_locks.sparse_decode import SparseDecodeWrapper, dense_decode_reference, sparse_decode_reference
from sglang_locks.summaries import _RANK_EPS, PageSummaries
from test_build_summaries import _scores
from test_sparse_attend import _rel, _rows

FP8 = torch.float8_e4m3fn


def _quantize(x, scale):
    """x as SGLang's set_kv_buffer stores it in an fp8 pool: x / scale, cast to float8_e4m3fn."""
    return (x.float() / scale).to(FP8)


def _fp8_keys(layers, pages, h, d, scales, device, seed):
    """Per layer: fp8 key buffers [pages * 16, h, d] of low-rank pages plus noise (page 2 one repeated key: rank 0)
    and the dequantised keys fp8.float() * scale in float32."""
    gen = torch.Generator().manual_seed(seed)
    fp8, deq = [], []
    for s in scales:
        mu = 2 * torch.randn(pages, 1, h, d, generator=gen)
        basis = torch.randn(pages, 1, h, 5, d, generator=gen) / d**0.5
        coef = torch.randn(pages, 16, h, 5, 1, generator=gen) * torch.linspace(5, 1, 5)[:, None]
        k = mu + (coef * basis).sum(3) + 0.05 * torch.randn(pages, 16, h, d, generator=gen)
        k[2] = k[2, :1]
        q = _quantize(k.reshape(pages * 16, h, d), s)
        assert torch.isfinite(q.float()).all()  # within e4m3's range (the cast does not saturate)
        fp8.append(q.to(device))
        deq.append((q.float() * s).to(device))
    return fp8, deq


def _page_rows(layers, device):
    page_ids = torch.tensor([4, 2, 0, 3], device=device)  # any order; page 2 rank-deficient
    slots = page_ids[:, None] * 16 + torch.arange(16, device=device)
    rows = torch.stack([page_ids + 5 * layer for layer in range(layers)])
    return slots, rows


def _fields(s, rows):
    return [t[rows.flatten()] for t in (s.mu, s.mu_scale, s.basis, s.coef, s.coef_scale)]


# Scales of few significant bits: fp8 x scale is exact in bf16, so a bf16 cache holds the dequantised keys exactly.
EXACT_SCALES = [0.375, 1.5, 5 / 128]


@pytest.mark.parametrize("precision, d, rank", [("int8-int4-int8", 64, 5), ("bf16", 32, 16)])
@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_fp8_summaries_equal_those_of_the_dequantised_bf16_cache(device, precision, d, rank, path, monkeypatch):
    """write_from_cache over fp8 buffers with each layer's k_scale builds, bit for bit, the summaries of a bf16
    cache holding fp8.float() * k_scale: the one-launch kernel (all layers at once, as the decode-seal flush) and
    the torch path (forced by a kernel limit of 0 programs)."""
    layers, pages, h = 3, 5, 2
    fp8, deq = _fp8_keys(layers, pages, h, d, EXACT_SCALES, device, seed=d + rank)
    bf16 = [k.to(torch.bfloat16) for k in deq]
    assert all(torch.equal(b.float(), k) for b, k in zip(bf16, deq))
    slots, rows = _page_rows(layers, device)
    if path == "torch":
        monkeypatch.setattr("sglang_locks.summaries._BUILD_KERNEL_MAX_PROGRAMS", 0)
    k_scales = torch.tensor(EXACT_SCALES, dtype=torch.float32, device=device)
    out = PageSummaries.allocate(5 * layers, h, d, rank, precision, device)
    ref = PageSummaries.allocate(5 * layers, h, d, rank, precision, device)
    out.write_from_cache(rows, fp8, slots, k_scales)
    ref.write_from_cache(rows, bf16, slots)
    for a, b in zip(_fields(out, rows), _fields(ref, rows)):
        assert torch.equal(a, b)
    assert out.mu[rows.flatten()].float().abs().sum() > 0


@pytest.mark.parametrize("precision", ["int8-int4-int8", "fp32"])
def test_fp8_kernel_build_matches_the_torch_reference_of_the_dequantised_keys(device, precision):
    """Scales of full float32 precision (fp8 x scale not a bf16 value): the kernel's summaries of each layer against
    the torch path's (write) of the float32 dequantised keys, to the tolerance of tests/test_build_summaries."""
    layers, pages, h, d, rank = 3, 5, 1, 64, 8
    scales = [0.0371, 1.37, 0.4471]
    fp8, deq = _fp8_keys(layers, pages, h, d, scales, device, seed=11)
    slots, rows = _page_rows(layers, device)
    out = PageSummaries.allocate(5 * layers, h, d, rank, precision, device)
    ref = PageSummaries.allocate(5 * layers, h, d, rank, precision, device)
    build_summaries_triton(out, rows, fp8, slots, _RANK_EPS, torch.tensor(scales, device=device))
    q = torch.randn(h, d, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    tol = {"int8-int4-int8": 0.02, "fp32": 1e-4}[precision]
    for layer_rows, keys in zip(rows, deq):
        ref.write(layer_rows, keys[slots])
        (mu_o, b_o, c_o), (mu_r, b_r, c_r) = ((t.double().cpu() for t in x.dequantize(layer_rows)) for x in (out, ref))
        torch.testing.assert_close(_scores(mu_o, b_o, c_o, q), _scores(mu_r, b_r, c_r, q), atol=tol * 10, rtol=tol)


def test_summary_builds_refuse_other_fp8_formats_and_bad_scales(device):
    s = PageSummaries.allocate(4, 1, 64, 8, "int8-int4-int8", device)
    slots, rows = torch.arange(16, device=device)[None], torch.zeros(1, 1, dtype=torch.int64, device=device)
    e5m2 = torch.zeros(64, 1, 64, device=device).to(torch.float8_e5m2)
    with pytest.raises(ValueError, match="float8_e5m2"):
        s.write_from_cache(rows, [e5m2], slots)
    with pytest.raises(ValueError, match="float8_e5m2"):
        build_summaries_triton(s, rows, [e5m2], slots, _RANK_EPS)
    fp8 = torch.zeros(64, 1, 64, device=device).to(FP8)
    with pytest.raises(ValueError, match=r"k_scales must be float32 \[1\]"):
        s.write_from_cache(rows, [fp8], slots, torch.ones(2, device=device))
    with pytest.raises(ValueError, match="k_scales must be float32"):
        s.write_from_cache(rows, [fp8], slots, torch.ones(1, dtype=torch.float64, device=device))


def _fp8_cache(c, k_scale, v_scale):
    """The fp8 cache of random_cache's bf16 one, and its dequantised values in float32."""
    k8, v8 = _quantize(c["k_cache"], k_scale), _quantize(c["v_cache"], v_scale)
    assert torch.isfinite(k8.float()).all() and torch.isfinite(v8.float()).all()
    return k8, v8, k8.float() * k_scale, v8.float() * v_scale


SHAPES = [  # seq_lens, KV heads, group, budget pages
    ([16 * 40 + 5, 7, 16 * 29], 2, 4, 24),
    ([16 * 50 + 11, 16 * 3 + 2], 1, 16, 40),
    ([16 * 26 + 15, 40, 16 * 12], 2, 1, 10),
]


@pytest.mark.parametrize("seq_lens, hkv, group, budget_pages", SHAPES)
@pytest.mark.parametrize("splits, pages_per_iter, dtype", [(1, 4, torch.bfloat16), (8, 8, torch.float16)])
def test_fp8_sparse_attend_equals_the_reference_over_the_dequantised_cache(device, seq_lens, hkv, group,
                                                                           budget_pages, splits, pages_per_iter, dtype):
    k_scale, v_scale = 0.0371, 2.3
    c = random_cache(seq_lens, hkv, 128, device=device, seed=group + splits)
    k8, v8, k_deq, v_deq = _fp8_cache(c, k_scale, v_scale)
    bsz = len(seq_lens)
    q = torch.randn(bsz, hkv * group, 128, generator=torch.Generator().manual_seed(splits + group)).to(device, dtype)
    indptr, indices, last = _rows(c, hkv, budget_pages, seed=splits)
    out = sparse_attend_triton(q, k8, v8, indptr.to(device), indices.to(device), last.to(device), bsz * hkv, splits,
                               128**-0.5, pages_per_iter=pages_per_iter, k_scale=k_scale, v_scale=v_scale)
    ref = sparse_decode_reference(q, k_deq, v_deq, indptr, indices, last, hkv, 128**-0.5)
    assert out.dtype == dtype and out.shape == q.shape
    assert _rel(out, ref) < 1e-2
    # the reference's own fp8 path: the same attention
    ref8 = sparse_decode_reference(q, k8, v8, indptr, indices, last, hkv, 128**-0.5, k_scale, v_scale)
    torch.testing.assert_close(ref8, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group", [1, 4, 16])
def test_fp8_budget_over_context_is_dense_attention_over_the_dequantised_cache(device, group):
    """Every page selected, through SparseDecodeWrapper (plan with an fp8 kv_dtype, run with the layer's scales):
    dense attention of each request over the dequantised cache."""
    seq_lens, hkv, k_scale, v_scale = [16 * 9 + 3, 16 * 5, 2, 16 * 7], 2, 0.52, 0.0917
    c = random_cache(seq_lens, hkv, 128, device=device, seed=group)
    k8, v8, k_deq, v_deq = _fp8_cache(c, k_scale, v_scale)
    bsz, budget_pages = len(seq_lens), 64
    q = torch.randn(bsz, hkv * group, 128, generator=torch.Generator().manual_seed(group)).to(device, torch.bfloat16)
    w = SparseDecodeWrapper(torch.empty(1 << 22, dtype=torch.uint8, device=device), hkv * group, hkv, 128, bsz,
                            bsz * hkv * (budget_pages + 1))
    w.plan(c["seq_lens"].cpu(), budget_pages, torch.bfloat16, FP8, 128**-0.5)
    indptr, indices, _ = _rows(c, hkv, budget_pages, seed=group)
    assert torch.equal(indptr, selected_pages(c["seq_lens"].cpu(), hkv, budget_pages)[0])
    w.indices[: indices.numel()].copy_(indices)
    out = w.run(q, k8, v8, k_scale=k_scale, v_scale=v_scale)
    tables = (c["req_to_token"], c["req_pool_indices"], c["seq_lens"])
    dense = dense_decode_reference(q, k_deq, v_deq, *tables, 128**-0.5)
    assert _rel(out, dense) < 1e-2
    torch.testing.assert_close(dense_decode_reference(q, k8, v8, *tables, 128**-0.5, k_scale, v_scale), dense,
                               rtol=1e-5, atol=1e-5)


def test_sparse_decode_refuses_other_fp8_formats():
    q = torch.zeros(1, 4, 128, dtype=torch.bfloat16)
    args = (torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([16]), 1, 1, 0.1)
    e5m2 = torch.zeros(32, 1, 128).to(torch.float8_e5m2)
    with pytest.raises(ValueError, match="torch.float8_e5m2"):
        sparse_attend_triton(q, e5m2, e5m2, *args)
    with pytest.raises(ValueError, match="bf16 or fp16 of one dtype, or the cache torch.float8_e4m3fn"):
        sparse_attend_triton(q, torch.zeros(32, 1, 128).to(FP8), torch.zeros(32, 1, 128, dtype=torch.bfloat16), *args)
    w = SparseDecodeWrapper(torch.empty(1 << 20, dtype=torch.uint8), 4, 1, 128, 1, 16)
    with pytest.raises(ValueError, match="torch.float8_e5m2"):
        w.plan(torch.tensor([40]), 2, torch.bfloat16, torch.float8_e5m2, 0.1)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", SPARSE_DECODE_KERNELS)
@pytest.mark.parametrize("seq_lens, hkv, group", [([16 * 300 + 5, 77, 16 * 129], 8, 4), ([16 * 500 + 11], 2, 16),
                                                  ([16 * 260 + 15, 40], 2, 1)])
def test_fp8_sparse_decode_on_the_gpu(kernel, seq_lens, hkv, group):
    """Both kernels over an fp8 cache (FlashInfer: planned with kv_data_type float8_e4m3fn, run with k_scale and
    v_scale) against the reference over the dequantised cache."""
    k_scale, v_scale, budget_pages = 0.0371, 2.3, 32
    c = random_cache(seq_lens, hkv, 128, device="cuda", seed=group)
    k8, v8, k_deq, v_deq = _fp8_cache(c, k_scale, v_scale)
    bsz = len(seq_lens)
    q = torch.randn(bsz, hkv * group, 128, device="cuda", dtype=torch.bfloat16)
    w = SparseDecodeWrapper(torch.zeros(128 << 20, dtype=torch.uint8, device="cuda"), hkv * group, hkv, 128, bsz,
                            bsz * hkv * (budget_pages + 1), kernel=kernel)
    w.plan(c["seq_lens"].cpu(), budget_pages, torch.bfloat16, FP8, 128**-0.5)
    indptr, indices, last = _rows(c, hkv, budget_pages, seed=group)
    w.indices[: indices.numel()].copy_(indices)
    out = w.run(q, k8, v8, k_scale=k_scale, v_scale=v_scale)
    assert _rel(out, sparse_decode_reference(q, k_deq, v_deq, indptr, indices, last, hkv, 128**-0.5)) < 1e-2


SUMMARY_BUILD = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sglang_locks.kernels import build_summaries as m
from sglang_locks.kernels.page_eigh import MAX_SWEEPS, _TOL

fn = m._build_summaries_kernel
names = fn.arg_names
for keys, scaled in (("*bf16", False), ("*fp8e4nv", True)):
    consts = dict(HKV=8, D=128, R=8, QUANT=True, RANK_EPS2=1e-12, MAX_SWEEPS=MAX_SWEEPS, TOL=_TOL, SCALED=scaled)
    ptrs = dict(k0_ptr=keys, layer_off_ptr="*i64", k_scale_ptr="*fp32", slots_ptr="*i64", rows_ptr="*i64",
                mu_ptr="*i8", mu_scale_ptr="*fp32", basis_ptr="*u8", coef_ptr="*i8", coef_scale_ptr="*fp32")
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "i32") for n in names}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()})
    built = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    print(len(built.asm["cubin"]) > 0, ("cvt.rn.f16x2.e4m3x2" in built.asm["ptx"]) == scaled)
"""


def test_summary_build_kernel_builds_for_sm90_from_bf16_and_fp8_caches():
    """The one-launch summary build for the H200, from bf16 keys and from scaled fp8 keys (widened by the hardware
    conversion)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", SUMMARY_BUILD], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True"] * 4


def test_fp8_locks_decode_step_attends_its_selection_over_the_dequantised_cache(device):
    """A whole LOCKS step (score, select, attend) over an fp8 cache: summaries built from its keys with the layer's
    k_scale, LocksDecode.run with both scales; its output is attention over the pages it selected in the
    dequantised cache (test_selection checks the picks; the dense case: the SparseDecodeWrapper test above)."""
    from sglang_locks.config import LocksConfig
    from sglang_locks.decode import LocksDecode

    seq_lens, hkv, group, k_scale, v_scale = [16 * 9 + 3, 16 * 6 + 15], 2, 4, 0.0625, 1.75
    c = random_cache(seq_lens, hkv, 128, device=device, seed=11)
    k8, v8, k_deq, v_deq = _fp8_cache(c, k_scale, v_scale)
    tables = (c["req_to_token"], c["req_pool_indices"], c["seq_lens"])
    pages = int(c["req_to_token"].max()) // 16 + 1
    slots = torch.arange(pages * 16, device=device).view(pages, 16)
    from_fp8 = PageSummaries.allocate(pages, hkv, 128, 8, "int8-int4-int8", device)
    from_fp8.write_from_cache(torch.arange(pages, device=device)[None], [k8], slots,
                              k_scales=torch.tensor([k_scale], device=device))
    cfg = LocksConfig(token_budget=64, sparse_decode="triton")
    q = torch.randn(len(seq_lens), hkv * group, 128, generator=torch.Generator().manual_seed(3)).to(device, torch.bfloat16)
    dec = LocksDecode(cfg, torch.empty(1 << 24, dtype=torch.uint8, device=device), hkv * group, hkv, 128, len(seq_lens))
    dec.plan(c["seq_lens"].cpu(), torch.bfloat16, FP8)
    out = dec.run(q, k8, v8, from_fp8, *tables, k_scale=k_scale, v_scale=v_scale)
    indptr, last = selected_pages(c["seq_lens"].cpu(), hkv, cfg.budget_pages)
    picked = dec.sparse.indices[: int(indptr[-1])]
    assert _rel(out, sparse_decode_reference(q, k_deq, v_deq, indptr, picked, last, hkv, 128**-0.5)) < 1e-2
