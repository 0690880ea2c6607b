"""Where one layer's LOCKS selection time goes: each kernel alone, and score-kernel tile sweeps.

    python benchmarks/score_sweep.py --out score_sweep.json

One layer, bs=1, random int8-int4-int8 summaries; CUDA-event medians. The
bandwidth column divides the summary bytes the scoring kernel must read by its time.
"""

import argparse
import json

import torch

from sglang_locks.config import LocksConfig
from sglang_locks.kernels.aggregate_scores import aggregate_scores_triton
from sglang_locks.kernels.score_pages import score_pages_triton
from sglang_locks.kernels.selected_indices import selected_indices_triton
from sglang_locks.selection import select_pages, selection_indptr

from attention_decode import SHAPES, median_ms, random_summaries


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    cfg = LocksConfig()
    rows = []
    for shape, context in (("llama3.1-8b", 131072), ("glm4-9b-1m", 1048576)):
        _, hkv, hq, d = SHAPES[shape]
        pages = context // 16 + 1
        summ = random_summaries(pages, hkv, d, cfg.rank)
        r2t = (torch.arange(context, device="cuda", dtype=torch.int32) + 16).view(1, context)
        rpi = torch.zeros(1, device="cuda", dtype=torch.int32)
        lens = torch.full((1,), context, device="cuda", dtype=torch.int32)
        q = torch.randn(1, hq, d, device="cuda", dtype=torch.bfloat16)
        max_pages = context // 16
        sbytes = hkv * max_pages * summ.bytes_per_page_per_head()
        for bp in (16, 32, 64):
            for nw in (2, 4, 8):
                try:
                    ms = median_ms(lambda: score_pages_triton(q, summ, r2t, rpi, lens, max_pages, 0.088, bp, nw), args.reps)
                except Exception as e:  # out of resources for this tile
                    rows.append({"shape": shape, "kernel": "score", "block_pages": bp, "num_warps": nw, "error": str(e)[:200]})
                    continue
                rows.append({"shape": shape, "kernel": "score", "block_pages": bp, "num_warps": nw, "us": ms * 1e3,
                             "summary_gbs": sbytes / ms / 1e6})
                print(rows[-1], flush=True)
        scores, pm, ps = score_pages_triton(q, summ, r2t, rpi, lens, max_pages, 0.088)
        agg = aggregate_scores_triton(scores, pm, ps, lens, hkv, 1, 1, "mass", 32)
        sel = select_pages(agg, cfg.budget_pages)
        indptr = selection_indptr(lens.cpu(), hkv, cfg.budget_pages).cuda()
        indices = torch.empty(int(indptr[-1]), dtype=torch.int32, device="cuda")
        for name, fn in (
            ("aggregate", lambda: aggregate_scores_triton(scores, pm, ps, lens, hkv, 1, 1, "mass", 32)),
            ("topk", lambda: select_pages(agg, cfg.budget_pages)),
            ("topk_sorted", lambda: torch.topk(agg.view(hkv, -1), cfg.budget_pages, dim=1)),
            ("write_indices", lambda: selected_indices_triton(sel, r2t, rpi, lens, indptr, indices, hkv, cfg.budget_pages)),
        ):
            rows.append({"shape": shape, "kernel": name, "us": median_ms(fn, args.reps) * 1e3})
            print(rows[-1], flush=True)
    json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
