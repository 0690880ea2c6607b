"""The memory side of the score kernel alone: how fast can Triton gather page summaries?

    python benchmarks/summary_gather.py --out summary_gather.json [--shapes llama3.1-8b,glm4-9b-1m]

A kernel with the score kernel's program layout (one (request, KV head) row's
chunk of pages per program, blocks of pages in a loop, page ids read through
the page table) loads every byte of each sealed page's summary
(804 B at d=128, r=8, int8-int4-int8) and does no scoring: an XOR of its
32-bit words per program, so that nothing is optimised away. Its bandwidth against a
device-to-device copy measured in the same run is the ceiling a score kernel
written this way can reach; the score kernel's own (score_sweep.py, 44 % of
copy bandwidth at Llama 128K) shows how much its math costs on top. Its loads
feed no dot, so Triton issues them as plain loads (no cp.async pipeline; 32-40
registers; num_stages changes nothing, so it is not swept): the loads in
flight come from the programs resident on an SM (--programs-per-sm). Pages
are sequential or scattered (--scatter: a random permutation, as a long-lived
server's allocator leaves them). CUDA-graph medians of 20 launches.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import sys

import torch
import triton
import triton.language as tl

from sglang_locks.config import PAGE_SIZE

PAGE = tl.constexpr(PAGE_SIZE)


@triton.jit
def _gather_kernel(mu_ptr, mu_scale_ptr, basis_ptr, coef_ptr, coef_scale_ptr, table_ptr, n_sealed, n_chunks, out_ptr,
                   HKV: tl.constexpr, D: tl.constexpr, R: tl.constexpr, BLOCK_P: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    h = row % HKV
    # The summaries as 32-bit words: a page's mu is D / 4 words, its basis R * D / 8, its coefficients 4 * R.
    mu_w = mu_ptr.to(tl.pointer_type(tl.int32))
    basis_w = basis_ptr.to(tl.pointer_type(tl.int32))
    coef_w = coef_ptr.to(tl.pointer_type(tl.int32))
    row_chunk = tl.cdiv(tl.cdiv(n_sealed, n_chunks), BLOCK_P) * BLOCK_P
    start = chunk * row_chunk
    end = tl.minimum(start + row_chunk, n_sealed)
    last = tl.maximum(end - 1, 0)
    jp = tl.arange(0, BLOCK_P)
    k_mu = tl.arange(0, D // 4)
    k_basis = tl.arange(0, R * D // 8)
    k_coef = tl.arange(0, 4 * R)
    r = tl.arange(0, R)
    acc = tl.zeros((BLOCK_P,), tl.int32)
    acc_f = tl.zeros((BLOCK_P,), tl.float32)
    for p0 in range(start, end, BLOCK_P):
        p = p0 + jp
        valid = p < end
        rec = tl.load(table_ptr + tl.minimum(p, last) * PAGE) // PAGE * HKV + h
        words = (tl.xor_sum(tl.load(mu_w + rec[:, None] * (D // 4) + k_mu[None, :]), 1)
                 ^ tl.xor_sum(tl.load(basis_w + rec[:, None] * (R * D // 8) + k_basis[None, :]), 1)
                 ^ tl.xor_sum(tl.load(coef_w + rec[:, None] * (4 * R) + k_coef[None, :]), 1))
        scales = tl.load(mu_scale_ptr + rec) + tl.sum(tl.load(coef_scale_ptr + rec[:, None] * R + r[None, :]), 1)
        acc ^= tl.where(valid, words, 0)
        acc_f += tl.where(valid, scales, 0.0)
    tl.store(out_ptr + row * n_chunks + chunk, tl.xor_sum(acc, 0))
    tl.store(out_ptr + (tl.num_programs(0) + row) * n_chunks + chunk, tl.sum(acc_f, 0).to(tl.int32, bitcast=True))


def gather_summaries(summaries, table, n_sealed: int, n_chunks: int, block_pages=16, num_warps=2):
    """Launch over one request's n_sealed pages, all KV heads: int32 [2, H_kv, n_chunks] (XOR of the summary
    words, float scale sums bit-cast)."""
    hkv, d, r = summaries.num_kv_heads, summaries.mu.shape[-1], summaries.rank
    out = torch.empty(2, hkv, n_chunks, dtype=torch.int32, device=table.device)
    _gather_kernel[(hkv, n_chunks)](summaries.mu, summaries.mu_scale, summaries.basis, summaries.coef,
                                    summaries.coef_scale, table, n_sealed, n_chunks, out,
                                    HKV=hkv, D=d, R=r, BLOCK_P=block_pages, num_warps=num_warps)
    return out


def _xor(t: torch.Tensor, dim: int) -> torch.Tensor:
    """XOR over dim, by halving (log2 of its size ops, not one per element)."""
    t = t.movedim(dim, -1)
    while t.shape[-1] > 1:
        if t.shape[-1] % 2:
            t = torch.nn.functional.pad(t, (0, 1))
        t = t[..., 0::2] ^ t[..., 1::2]
    return t[..., 0] if t.shape[-1] else torch.zeros(t.shape[:-1], dtype=t.dtype, device=t.device)


def gather_reference(summaries, table, n_sealed: int):
    """Checksums of one request's sealed pages per KV head: (XOR of their summary words [H_kv] int32,
    scale sums [H_kv] float64)."""
    pages = table[: n_sealed * PAGE_SIZE : PAGE_SIZE].long() // PAGE_SIZE
    hkv = summaries.num_kv_heads
    words = torch.cat([t[pages].reshape(n_sealed, hkv, t[0, 0].numel()).contiguous().view(torch.int32)
                       for t in (summaries.mu, summaries.basis, summaries.coef)], -1)
    total = _xor(words.permute(1, 0, 2).reshape(hkv, -1), 1)
    scales = summaries.mu_scale[pages].double() + summaries.coef_scale[pages].double().sum(-1)
    return total, scales.sum(0)


def check(summaries, table, n_sealed: int, n_chunks: int, **launch) -> None:
    """The kernel's checksums, combined over chunks, equal the reference's (scale sums to float32 rounding)."""
    out = gather_summaries(summaries, table, n_sealed, n_chunks, **launch).cpu()
    words, scales = gather_reference(summaries, table, n_sealed)
    got_scales = out[1].view(torch.float32).double().sum(-1)
    assert torch.equal(_xor(out[0], 1), words.cpu()), (out[0], words)
    assert torch.allclose(got_scales, scales.cpu(), rtol=1e-4), (got_scales, scales)


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from attention_decode import SHAPES, copy_bandwidth_gbs, launch_us, random_summaries

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="llama3.1-8b,glm4-9b-1m")
    ap.add_argument("--contexts", default="131072,1048576", help="one per shape, in order")
    ap.add_argument("--block-pages", default="8,16,32")
    ap.add_argument("--num-warps", default="2,4")
    ap.add_argument("--programs-per-sm", default="8,16,32", help="chunks per row = this x SMs / KV heads")
    ap.add_argument("--scatter", action="store_true", help="pages in random order, not sequential")
    args = ap.parse_args()
    copy_gbs = copy_bandwidth_gbs()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for shape, context in zip(args.shapes.split(","), map(int, args.contexts.split(","))):
        _, hkv, _, d = SHAPES[shape]
        n_sealed = context // PAGE_SIZE
        summaries = random_summaries(n_sealed + 1, hkv, d, 8)
        order = torch.randperm(n_sealed, device="cuda") if args.scatter else torch.arange(n_sealed, device="cuda")
        offsets = torch.arange(PAGE_SIZE, device="cuda", dtype=torch.int32)
        # One request's req_to_token row: page 0 unused, as in SGLang.
        table = ((order + 1).to(torch.int32)[:, None] * PAGE_SIZE + offsets).reshape(-1)
        moved = hkv * n_sealed * summaries.bytes_per_page_per_head() + n_sealed * 4
        for bp, nw, pps in itertools.product(*(map(int, a.split(",")) for a in (
                args.block_pages, args.num_warps, args.programs_per_sm))):
            n_chunks = max(1, pps * sms // hkv)
            launch = dict(block_pages=bp, num_warps=nw)
            check(summaries, table, n_sealed, n_chunks, **launch)
            us = launch_us(lambda: gather_summaries(summaries, table, n_sealed, n_chunks, **launch))
            rows.append(dict(shape=shape, context=context, scatter=args.scatter, programs_per_sm=pps, **launch,
                             us=us, gbs=moved / us / 1e3, copy_fraction=moved / us / 1e3 / copy_gbs))
            print(rows[-1], flush=True)
            with open(args.out, "w") as f:
                json.dump({"gpu": torch.cuda.get_device_name(), "git": os.environ.get("GIT_REV", ""),
                           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           "command": " ".join(["python"] + sys.argv), "copy_gbs": copy_gbs, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
