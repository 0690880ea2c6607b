"""Summary build on the GPU: Gram-eigh path vs batched SVD, speed and accuracy.

    python benchmarks/summary_build.py --out benchmarks/results/summary_build.json

Pages are random-structured keys [n, 16, d] (rank-6 + noise). Accuracy: the
relative reconstruction error of the centred keys against the float64 SVD
optimum. Timing: CUDA events, median of --reps, per 1000 (page, KV head) pairs.
"""

import argparse
import json

import torch

from sglang_locks.summaries import quantize_summary, summarize_pages, summarize_pages_reference

from attention_decode import median_ms  # a script's own folder is on sys.path


def svd_path(keys, rank):
    mu = keys.mean(1)
    dev = keys - mu[:, None]
    _, _, vh = torch.linalg.svd(dev, full_matrices=False)
    basis = vh[:, :rank]
    return mu, basis, dev @ basis.transpose(1, 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--pages", type=int, default=16384, help="(page, KV head) pairs per call")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    n, d, r = args.pages, 128, 8
    basis = torch.linalg.qr(torch.randn(n, d, 6, device="cuda", generator=gen)).Q.transpose(1, 2)
    keys = (torch.randn(n, 1, d, device="cuda", generator=gen) * 3
            + torch.randn(n, 16, 6, device="cuda", generator=gen) @ basis
            + 0.05 * torch.randn(n, 16, d, device="cuda", generator=gen))
    keys = keys.bfloat16().float()
    ref_mu, ref_b, ref_c = summarize_pages_reference(keys[:2048].cpu(), r)
    dev = keys[:2048].cpu().double() - ref_mu[:, None]
    ref_err = ((dev - ref_c @ ref_b).norm() / dev.norm()).item()
    rows = {}
    for name, fn in (("gram_eigh", summarize_pages), ("batched_svd", svd_path)):
        ms = median_ms(lambda: fn(keys, r), args.reps)
        mu, b, c = (t[:2048].cpu().double() for t in fn(keys, r))
        err = ((dev - c @ b).norm() / dev.norm()).item()
        rows[name] = {"ms": ms, "us_per_1000_pages": 1000 * ms / n * 1000, "rel_reconstruction_error": err}
    mu, b, _ = summarize_pages(keys, r)
    rows["quantize"] = {"ms": median_ms(lambda: quantize_summary(keys, mu, b), args.reps)}
    result = {"gpu": torch.cuda.get_device_name(), "pages": n, "head_dim": d, "rank": r,
              "optimal_rel_reconstruction_error": ref_err, "paths": rows}
    json.dump(result, open(args.out, "w"), indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
