"""Host time of summarising decode-sealed pages, and whether it waits for the GPU.

    python benchmarks/flush_host_time.py [--pages 1,4] [--layers 32 --kv-heads 8 --head-dim 128]

A SummaryStore beside a KV pool of random bf16 keys (the Llama-3.1-8B shape
by default); each case seals N pages (a decode step of N requests crossing a
page boundary) and times SummaryStore.flush_pending, the call the LOCKS
backend makes before the next decode step. "while GPU busy": a ~100 ms GPU
sleep is queued first and the host time of the call is measured, then whether
the GPU was still busy when it returned (True: the call did not wait for the
GPU). "alone": host + GPU time of one call with nothing queued.
"""

import argparse
import time

import torch

from sglang_locks.config import LocksConfig
from sglang_locks.plugin.summary_store import SummaryStore


class RandomKeyPool:
    """The part of SGLang's KV pool the store reads: one key buffer per layer."""

    def __init__(self, layers, pages, kv_heads, head_dim):
        self.k = [torch.randn(pages * 16, kv_heads, head_dim, device="cuda").bfloat16() for _ in range(layers)]

    def get_key_buffer(self, layer):
        return self.k[layer]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", default="1,4", help="pages sealed per flush")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--pool-pages", type=int, default=8201)
    args = ap.parse_args()
    pool = RandomKeyPool(args.layers, args.pool_pages, args.kv_heads, args.head_dim)
    store = SummaryStore(LocksConfig(), list(range(args.layers)), args.pool_pages, args.kv_heads, args.head_dim, "cuda")
    store.warm_up(pool)

    def flush(n):
        pages = torch.randint(1, args.pool_pages, (n,), device="cuda")
        store._pending.append((pages, store.page_generation[pages].clone()))
        store.flush_pending(pool)

    for n in map(int, args.pages.split(",")):
        for _ in range(3):
            flush(n)
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # GPU cycles: ~0.1 s
        t0 = time.perf_counter()
        flush(n)
        host = time.perf_counter() - t0
        busy = not torch.cuda.current_stream().query()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        flush(n)
        torch.cuda.synchronize()
        alone = time.perf_counter() - t0
        print(f"flush_pending, {n} page(s) x {args.layers} layers x {args.kv_heads} KV heads: host {1e3 * host:.2f} ms "
              f"while GPU busy={busy}; alone (host + GPU) {1e3 * alone:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
