"""Summary build on the GPU: speed and accuracy of the paths, at decode-flush and prefill sizes.

    python benchmarks/summary_build.py --out benchmarks/results/summary_build.json [--pages 256,1024,16384]

Pages are random-structured keys [n, 16, d] (rank-6 + noise). Per size n of
(page, KV head) pairs (256: a decode step of a Llama-8B request sealing a page
in all 32 layers x 8 KV heads):

* ``eigh_jacobi`` / ``eigh_torch``: the eigendecomposition of the n 16x16 Gram
  matrices alone, page_eigh's kernel vs torch.linalg.eigh (float64; it syncs).
* ``summarize``: summarize_pages (Gram + eigendecomposition + basis, float32
  out); ``batched_svd``: torch.linalg.svd of the centred keys instead (only
  for n <= 1024: it takes seconds).
* ``write``: PageSummaries.write (the torch path: summarise + quantise +
  scatter, int8-int4-int8) and ``write_from_cache`` from a KV-cache buffer
  (build_summaries' one kernel up to 1024 pairs, write() above), each with
  its host time per call (calls back to back, no sync in between), and the
  reconstruction error of what they stored (dequantised).

Accuracy: relative reconstruction error of the centred keys against the float64
SVD optimum (first 2048 pairs). Timing: CUDA events, median of --reps.

``--profile-pages N`` (default 38400: one layer of a 4,800-page HiCache reload, or of a 77K-token
prefill, at 8 KV heads) also writes a torch.profiler table of one write() of N pairs, by device
time, beside --out (``*_profile.txt``): where a large build's time goes.
"""

import argparse
import json
import statistics
import time

import torch

from sglang_locks.kernels.page_eigh import page_eigh_torch, page_eigh_triton
from sglang_locks.summaries import PageSummaries, summarize_pages, summarize_pages_reference

from attention_decode import median_ms  # a script's own folder is on sys.path


def svd_path(keys, rank):
    mu = keys.mean(1)
    dev = keys - mu[:, None]
    _, _, vh = torch.linalg.svd(dev, full_matrices=False)
    basis = vh[:, :rank]
    return mu, basis, dev @ basis.transpose(1, 2)


def structured_keys(n, d, gen):
    basis = torch.linalg.qr(torch.randn(n, d, 6, device="cuda", generator=gen)).Q.transpose(1, 2)
    keys = (torch.randn(n, 1, d, device="cuda", generator=gen) * 3
            + torch.randn(n, 16, 6, device="cuda", generator=gen) @ basis
            + 0.05 * torch.randn(n, 16, d, device="cuda", generator=gen))
    return keys.bfloat16().float()


def host_ms(fn, reps):
    """Host time per call of fn, calls back to back (a call that waits for the GPU shows here)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    torch.cuda.synchronize()
    return statistics.median(times)


def profile_write(n, d, r, gen) -> str:
    """torch.profiler's op table of one PageSummaries.write of n (page, KV head) pairs, by device time."""
    from torch.profiler import ProfilerActivity, profile

    store = PageSummaries.allocate(n, 1, d, r, "int8-int4-int8", "cuda")
    ids = torch.arange(n, device="cuda")
    cached = structured_keys(n, d, gen).bfloat16()[:, :, None]
    store.write(ids, cached)  # warm-up: compiles, fills the allocator's cache
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        store.write(ids, cached)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--pages", default="256,1024,16384,65536", help="(page, KV head) pairs per call; 65536: one layer of a 128K Llama-8B prefill")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--profile-pages", type=int, default=38400, help="pairs of the profiled write() (0: none)")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    d, r = 128, 8
    result = {"gpu": torch.cuda.get_device_name(), "head_dim": d, "rank": r, "sizes": {}}
    for n in map(int, args.pages.split(",")):
        keys = structured_keys(n, d, gen)
        m = min(n, 2048)
        ref_mu, ref_b, ref_c = summarize_pages_reference(keys[:m].cpu(), r)
        dev = keys[:m].cpu().double() - ref_mu[:, None]
        x = keys.double() - keys.double().mean(1, keepdim=True)
        gram = x @ x.transpose(1, 2)
        rows = {"optimal_rel_reconstruction_error": ((dev - ref_c @ ref_b).norm() / dev.norm()).item()}
        eighs = [("eigh_jacobi", page_eigh_triton)] + ([("eigh_torch", page_eigh_torch)] if n <= 16384 else [])
        for name, fn in eighs:  # (cuSOLVER's batched eigh has failed on batches of ~10^5)
            rows[name] = {"ms": median_ms(lambda: fn(gram), args.reps)}
        paths = [("summarize", summarize_pages)] + ([("batched_svd", svd_path)] if n <= 1024 else [])
        for name, fn in paths:
            mu, b, c = (t[:m].cpu().double() for t in fn(keys, r))
            rows[name] = {"ms": median_ms(lambda: fn(keys, r), args.reps),
                          "rel_reconstruction_error": ((dev - c @ b).norm() / dev.norm()).item()}
        store = PageSummaries.allocate(n, 1, d, r, "int8-int4-int8", "cuda")
        ids = torch.arange(n, device="cuda")
        cached = keys.bfloat16()[:, :, None]  # [n, 16, H=1, d], as cached
        buffer = cached.reshape(n * 16, 1, d)  # a KV cache's key buffer holding the n pages
        slots = ids[:, None] * 16 + torch.arange(16, device="cuda")
        for name, fn in (("write", lambda: store.write(ids, cached)),
                         ("write_from_cache", lambda: store.write_from_cache(ids[None], [buffer], slots))):
            rows[name] = {"ms": median_ms(fn, args.reps), "host_ms": host_ms(fn, args.reps)}
            mu, b, c = (t[:m, 0].cpu().double() for t in store.dequantize(ids))
            rec = mu[:, None] + c @ b
            x = keys[:m].cpu().double()
            rows[name]["rel_reconstruction_error"] = ((rec - x).norm() / (x - x.mean(1, keepdim=True)).norm()).item()
        result["sizes"][n] = rows
        print(n, json.dumps(rows), flush=True)
    if args.profile_pages:
        table = profile_write(args.profile_pages, d, r, gen)
        result["profile_pages"] = args.profile_pages
        with open(args.out.removesuffix(".json") + "_profile.txt", "w") as f:
            f.write(f"PageSummaries.write of {args.profile_pages} (page, KV head) pairs, one call\n{table}\n")
        print(table, flush=True)
    json.dump(result, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
