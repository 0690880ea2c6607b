"""Compute floor of the score kernel: one layer (bs=1) on its sequential page table, then on tables whose
pages all map to 1, 64 or 4096 physical pages (the summaries read sit in L1 / L2, so memory latency and
bandwidth mostly drop out). CUDA-graph medians of 20 launches.

    OUT=DIR [GLUON_KERNEL=FILE] python benchmarks/trials/score_floor_probe.py   (from the repository root)

GLUON_KERNEL: a copy of branch gluon-score-trial's kernels/score_pages_mma.py, timed the same way
(git show gluon-score-trial:kernels/score_pages_mma.py > FILE). Writes DIR/score_floor_probe.json.
"""
import importlib.util
import json
import os
import sys

import torch

sys.path.insert(0, "benchmarks")
from attention_decode import copy_bandwidth_gbs, launch_us, one_layer_inputs  # noqa: E402
from sglang_locks.kernels.score_pages import score_pages_triton  # noqa: E402

kernels = {"triton": score_pages_triton}
if os.environ.get("GLUON_KERNEL"):
    spec = importlib.util.spec_from_file_location("sglang_locks.kernels.score_pages_mma", os.environ["GLUON_KERNEL"])
    mma = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mma
    spec.loader.exec_module(mma)
    kernels["mma_2_2"] = lambda *c: mma.score_pages_mma(*c, pairs=2, num_warps=2, slots=1)
    kernels["mma_4_4"] = lambda *c: mma.score_pages_mma(*c, pairs=4, num_warps=4, slots=1)

rows = []
copy = copy_bandwidth_gbs()
for shape in ("llama3.1-8b", "glm4-9b-1m"):
    call, moved = one_layer_inputs(shape)
    q, summaries, table, pool, seq_lens, max_pages, scale = call
    n = table.shape[1]
    tok = torch.arange(n, device="cuda", dtype=torch.int32)
    tables = {"seq": table}
    for pages in (1, 64, 4096):
        tables[f"{pages}_pages"] = (16 + tok % (16 * pages)).view(1, n)
    for tname, t in tables.items():
        args = (q, summaries, t, pool, seq_lens, max_pages, scale)
        for kname, kernel in kernels.items():
            us = launch_us(lambda: kernel(*args))
            rows.append(dict(shape=shape, table=tname, kernel=kname, us=us, copy_fraction=moved / us / 1e3 / copy))
            print(rows[-1], flush=True)
json.dump({"gpu": torch.cuda.get_device_name(), "copy_gbs": copy, "rows": rows},
          open(os.path.join(os.environ.get("OUT", "."), "score_floor_probe.json"), "w"), indent=1)
