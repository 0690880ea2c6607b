"""HiCache's reloaded pages: rebuilding their summaries against copying them back from host memory (GPU).

    python benchmarks/hicache_summary_cost.py --out $OUT/hicache_summary_cost.json [--pages 320,1200,4800]

For n reloaded pages of a Llama-3.1-8B-shaped cache (32 layers, 8 KV heads, d = 128, bf16; summaries int8-int4-int8
of rank 8), each a median of --reps (CUDA events):

* ``rebuild_ms``: what the plugin does (SummaryStore.build_layer in each layer's extend): PageSummaries.
  write_from_cache of the n pages, layer by layer, from the keys in the device cache;
* ``summary_copy_ms``: what keeping the summaries beside the host KV would add to a load-back: the n pages'
  summary bytes of every layer from pinned host memory into their rows of the device store (one index_copy_
  per summary tensor and layer, as pages land scattered);
* ``kv_copy_ms``: the load-back itself, the n pages' K and V of every layer from pinned host memory, contiguous:
  a lower bound of HiCache's own transfer.

Choose by rebuild_ms against summary_copy_ms, each next to kv_copy_ms (docs/design.md, "HiCache").
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from attention_decode import median_ms  # noqa: E402
from e2e_decode import header  # noqa: E402

from sglang_locks.config import PAGE_SIZE  # noqa: E402
from sglang_locks.summaries import PageSummaries  # noqa: E402

LAYERS, KV_HEADS, HEAD_DIM, RANK, PRECISION = 32, 8, 128, 8, "int8-int4-int8"


def costs(pages: int, pool_pages: int, reps: int, device: str, layers: int = LAYERS) -> dict:
    gen = torch.Generator(device=device).manual_seed(pages)
    physical = torch.randperm(pool_pages - 1, generator=gen, device=device)[:pages] + 1  # page 0: never mapped
    slots = physical[:, None] * PAGE_SIZE + torch.arange(PAGE_SIZE, device=device)
    k_cache = [torch.randn(pool_pages * PAGE_SIZE, KV_HEADS, HEAD_DIM, generator=gen, device=device,
                           dtype=torch.bfloat16) for _ in range(layers)]
    store = [PageSummaries.allocate(pool_pages, KV_HEADS, HEAD_DIM, RANK, PRECISION, device) for _ in range(layers)]
    tensors = [(s.mu, s.mu_scale, s.basis, s.coef, s.coef_scale) for s in store]
    pin = device != "cpu"
    host_summaries = [[torch.empty((pages, *t.shape[1:]), dtype=t.dtype, pin_memory=pin) for t in layer]
                      for layer in tensors]
    kv_bytes = layers * 2 * pages * PAGE_SIZE * KV_HEADS * HEAD_DIM * 2
    host_kv = torch.empty(kv_bytes, dtype=torch.uint8, pin_memory=pin)
    device_kv = torch.empty(kv_bytes, dtype=torch.uint8, device=device)

    def rebuild():
        for layer in range(layers):
            store[layer].write_from_cache(physical[None], [k_cache[layer]], slots)

    def summary_copy():
        for layer_tensors, layer_host in zip(tensors, host_summaries):
            for t, h in zip(layer_tensors, layer_host):
                t.index_copy_(0, physical, h.to(device, non_blocking=True))

    def kv_copy():
        device_kv.copy_(host_kv, non_blocking=True)

    summary_bytes = sum(h.numel() * h.element_size() for layer in host_summaries for h in layer)
    return dict(pages=pages, layers=layers, kv_heads=KV_HEADS, head_dim=HEAD_DIM, rank=RANK,
                rebuild_ms=_time(rebuild, reps, device), summary_copy_ms=_time(summary_copy, reps, device),
                kv_copy_ms=_time(kv_copy, reps, device), summary_bytes=summary_bytes, kv_bytes=kv_bytes)


def _time(fn, reps: int, device: str) -> float:
    fn()  # compiles the build kernel where it runs
    if device == "cpu":  # a check that the script runs, not a measurement
        return float("nan")
    return median_ms(fn, reps)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--pages", default="320,1200,4800", help="reloaded pages per case (1200: a 19,200-token prefix)")
    ap.add_argument("--pool-pages", type=int, default=16384)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    rows = []
    for n in (int(p) for p in args.pages.split(",")):
        rows.append(costs(n, args.pool_pages, args.reps, args.device, args.layers))
        print("hicache_summary_cost:", rows[-1], flush=True)
    with open(args.out, "w") as f:
        json.dump({**header(argv), "command": " ".join(["python", "benchmarks/hicache_summary_cost.py", *argv]),
                   "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
