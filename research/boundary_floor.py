"""H200: the least that the three launches after the score kernel (selection, sparse decode, merge) can add to the
LOCKS attention step at bs=1, whatever they compute. Every layer in one CUDA graph (probe_inputs.ChainStep), modes
alternated ROUNDS times in one process:

  score          the score kernel alone (as chain_bounds.py)
  score_tokens   the score kernel, then three token kernels on the grids and launch settings of the selection
                 (not a dependent launch), the sparse decode and the merge (dependent launches): each waits for the
                 kernel before it, makes one dependent round trip to memory (loads what that kernel stored) and stores
  tokens         the three token kernels alone
  full           the real step (score, select, sparse decode, merge)

so that score_tokens - score is the floor of the three launches in place, against full - score now.

    python research/boundary_floor.py OUT.json [SHAPE:BATCH:CONTEXT ...]
"""
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_inputs import ChainStep, save_rows  # noqa: E402
from sglang_locks.kernels._triton import dependent_launch, num_sms, pdl_start  # noqa: E402
from sglang_locks.kernels.page_selection import selection_parts  # noqa: E402
from sglang_locks.kernels.sparse_attend import attend_launch  # noqa: E402

ROUNDS = 3


@triton.jit
def _token_kernel(src, dst, n, PDL: tl.constexpr):
    pdl_start(PDL)
    pid = tl.program_id(0)
    x = tl.load(src + pid % n)
    tl.store(dst + pid, x + 1)


def main():
    out_path = sys.argv[1]
    cases = [(s, int(b), int(n)) for s, b, n in (c.split(":") for c in sys.argv[2:])] or [
        ("llama3.1-8b", 1, 131072), ("glm4-9b-1m", 1, 1048576)]
    rows = []
    for shape, bsz, context in cases:
        chain = ChainStep(shape, [context] * bsz, max_pages=(context + 1024) // 16)
        dec, dev = chain.dec, chain.q.device
        pages = context // 16
        parts = selection_parts(chain.rows, pages, dev, chain.group)
        splits, _ = attend_launch(chain.rows, dec.config.budget_pages + 1, num_sms(dev))
        grids = [chain.rows * parts, chain.rows * splits, chain.rows * chain.group]
        launches = [dependent_launch(dev, "select"), dependent_launch(dev, "attend"), dependent_launch(dev, "merge")]
        bufs = [torch.zeros(max(grids), dtype=torch.int32, device=dev) for _ in range(3)]

        def tokens(layer):
            for i, (grid, launch) in enumerate(zip(grids, launches)):
                _token_kernel[(grid,)](bufs[i], bufs[(i + 1) % 3], grids[i - 1], num_warps=4, **launch)

        runs = {"score": chain.every_layer((chain.score,)), "score_tokens": chain.every_layer((chain.score, tokens)),
                "tokens": chain.every_layer((tokens,)), "full": chain.run}
        times, us = chain.alternate(runs, ROUNDS)
        row = {"shape": shape, "batch": bsz, "context": context, "grids": grids, "ms": times, "us_per_layer": us,
               "derived_us_per_layer": {"tokens_after_score": round(us["score_tokens"] - us["score"], 2),
                                        "real_after_score": round(us["full"] - us["score"], 2)}}
        print(json.dumps({k: v for k, v in row.items() if k != "ms"}), flush=True)
        rows.append(row)
        del chain
        torch.cuda.empty_cache()
        save_rows(out_path, "python research/boundary_floor.py OUT.json " + " ".join(sys.argv[2:]), rows)


if __name__ == "__main__":
    main()
