"""Capture post-RoPE keys, values and decode queries of the tiny LM on held-out documents.

    python -m benchmarks.tiny_lm.capture_kv --model DIR --out KV_DIR [--context 16384 --docs 2 --queries 64]

Each document has exactly --context tokens from one held-out package. The
model runs densely; per layer, the file KV_DIR/<package>-<offset>-L<layer>.pt
holds ``keys``/``values`` [N, H_kv, d] of the first N = context - queries
positions and ``queries`` [M, H_q, d] of the last M = --queries positions, the
format ``python -m sglang_locks.evaluate --kv FILE`` reads ("queries come after
the N keys": the query at position N + i really also attends the i keys before
it, which the file leaves out). Tensors stay in the model's dtype (bf16 on GPU,
as the KV cache holds them).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import List

import torch

from .corpus import DEFAULT_EXTRA_ROOTS, default_roots, load_corpus
from .export import load_model
from .model import dense_attend


@torch.no_grad()
def capture(model, ids: torch.Tensor, n_queries: int) -> List[dict]:
    """ids [B, T] -> per layer {keys, values [B, T-M, H_kv, d], queries [B, M, H_q, d]}, M = n_queries."""
    if not 0 < n_queries < ids.shape[1]:
        raise ValueError(f"need 0 < queries < context, got {n_queries} and {ids.shape[1]}")
    n = ids.shape[1] - n_queries
    layers: List[dict] = []

    def record(layer, q, k, v, q_start):
        layers.append({"keys": k[:, :, :n].transpose(1, 2), "values": v[:, :, :n].transpose(1, 2),
                       "queries": q[:, :, n:].transpose(1, 2)})
        return dense_attend(layer, q, k, v, q_start)

    model(ids, attend=record)
    return layers


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tiny_lm.capture_kv", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--docs", type=int, default=2)
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--extra-roots", default=",".join(DEFAULT_EXTRA_ROOTS))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    t0 = time.time()
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    model = load_model(args.model, args.device, dtype)
    corpus = load_corpus(default_roots([r for r in args.extra_roots.split(",") if r]))
    docs = corpus.held_out_documents(args.context, args.docs)
    if not docs:
        raise SystemExit(f"no held-out package has {args.context} tokens of text")
    os.makedirs(args.out, exist_ok=True)
    for doc in docs:
        layers = capture(model, doc["ids"][None].to(args.device), args.queries)
        for i, kv in enumerate(layers):
            path = os.path.join(args.out, f"{doc['package']}-{doc['offset']}-L{i}.pt")
            torch.save({name: t[0].cpu().contiguous() for name, t in kv.items()}, path)
        print(f"[capture] {doc['package']}@{doc['offset']}: {len(layers)} layers, keys "
              f"{tuple(layers[0]['keys'][0].shape)}, queries {tuple(layers[0]['queries'][0].shape)}", flush=True)
    print(f"[capture] {len(docs)} documents in {time.time() - t0:.1f} s -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
