"""Where one layer's LOCKS selection time goes: each kernel alone, and score-kernel tile sweeps.

    python benchmarks/score_sweep.py --out score_sweep.json

One layer, bs=1, random int8-int4-int8 summaries; CUDA-event medians of CUDA
graphs of --inner launches (a lone launch would time the host's launch
latency, not the kernel). The
bandwidth column divides the bytes the scoring kernel must move (summaries,
page ids, scores written) by its time; copy_gbs is a device-to-device copy
measured in the same run.
"""

import argparse
import itertools
import json
import os
import sys

import torch

from sglang_locks.config import LocksConfig
from sglang_locks.kernels.aggregate_scores import aggregate_scores_triton
from sglang_locks.kernels.score_pages import chunk_pages_for, score_pages_triton
from sglang_locks.kernels.page_selection import PageScores, SelectionState, selected_indices_triton
from sglang_locks.selection import select_pages, selected_pages

from attention_decode import ONE_LAYER_CONTEXTS, copy_bandwidth_gbs, launch_us, one_layer_inputs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--inner", type=int, default=20, help="launches per timed graph")
    ap.add_argument("--block-pages", default="8,16,32")
    ap.add_argument("--num-warps", default="2,4")
    ap.add_argument("--num-stages", default="3")
    ap.add_argument("--chunk-pages", default="0", help="0: the wrapper's default; else pages per program")
    ap.add_argument("--int-conversion", default="ptx,int8")
    ap.add_argument("--maxnreg", default="0", help="0: the compiler's choice; else registers per thread")
    args = ap.parse_args()
    cfg = LocksConfig()
    copy_gbs = copy_bandwidth_gbs()
    rows = []

    def save():  # after every row: a run cut short keeps what it measured
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "git": os.environ.get("GIT_REV", ""),
                       "command": " ".join(["python"] + sys.argv), "copy_gbs": copy_gbs, "rows": rows}, f, indent=1)

    def kernel_us(fn):
        return launch_us(fn, args.reps, args.inner)

    for shape in ONE_LAYER_CONTEXTS:
        call, moved = one_layer_inputs(shape)
        q, summ, r2t, rpi, lens, max_pages, _ = call
        hkv = summ.num_kv_heads
        grid = itertools.product(*(map(int, a.split(",")) for a in (args.block_pages, args.num_warps, args.num_stages,
                                                                     args.chunk_pages, args.maxnreg)),
                                 args.int_conversion.split(","))
        for bp, nw, ns, cp, mr, cvt in grid:
            opts = dict(block_pages=bp, num_warps=nw, num_stages=ns, chunk_pages=cp or None, int_conversion=cvt,
                        maxnreg=mr)
            row = {"shape": shape, "kernel": "score", **opts}
            try:
                us = kernel_us(lambda: score_pages_triton(*call, **opts))
            except Exception as e:  # out of resources for this tile
                rows.append({**row, "error": str(e)[:300]})
                print(rows[-1], flush=True)
                save()
                continue
            row["chunk_pages"] = cp or chunk_pages_for(hkv, max_pages, q.device, bp)
            rows.append({**row, "us": us, "gbs": moved / us / 1e3, "copy_fraction": moved / us / 1e3 / copy_gbs})
            print(rows[-1], flush=True)
            save()
        scored = score_pages_triton(*call)
        indptr, _ = selected_pages(lens.cpu(), hkv, cfg.budget_pages)
        indptr = indptr.to(q.device)
        indices = torch.empty(int(indptr[-1]), dtype=torch.int32, device=q.device)
        last_len = torch.empty(hkv, dtype=torch.int32, device=q.device)
        forced = (hkv, cfg.sink_pages, cfg.local_pages, cfg.gqa_aggregation)
        agg = aggregate_scores_triton(*scored, lens, *forced)
        state = SelectionState(hkv, q.device)
        for name, fn in (
            ("aggregate", lambda: aggregate_scores_triton(*scored, lens, *forced)),
            ("select", lambda: selected_indices_triton(PageScores(*scored), r2t, rpi, lens, indptr, indices, last_len,
                                                       *forced, cfg.budget_pages, state)),
            ("torch_topk", lambda: select_pages(agg, cfg.budget_pages)),
        ):
            rows.append({"shape": shape, "kernel": name, "us": kernel_us(fn)})
            print(rows[-1], flush=True)
            save()


if __name__ == "__main__":
    main()
