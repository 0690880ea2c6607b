"""H200: score_pages_gluon_heads (GLM-4-9B-1M, G = 16) by page pairs per step, shared-memory stages and programs
per SM (pages per program); and score_pages_gluon (Llama-3.1-8B, G = 4) by programs per SM. Distinct summaries
per launch, 20 launches per graph, median of 30 replays; scores compared with the shipped launch's.
    OUT=DIR python benchmarks/trials/score_heads_sweep.py"""
import itertools, json, os, sys, traceback
import torch
sys.path.insert(0, "benchmarks")
from attention_decode import copy_bandwidth_gbs, graph_ms, score_launched_alone
sys.path.insert(0, "benchmarks/trials")
from probe_inputs import score_inputs
from sglang_locks.kernels.score_pages import chunk_pages_for
from sglang_locks.kernels.score_pages_gluon import score_pages_gluon
from sglang_locks.kernels.score_pages_gluon_heads import score_pages_gluon_heads

OUT = os.environ.get("OUT", "/tmp")
rows = []
copy = copy_bandwidth_gbs()


def sweep(shape, bsz, context, kernel, configs):
    pages = context // 16
    nset = 4 if bsz * context <= 262144 else 2
    sums, tables, q, moved = score_inputs(shape, bsz, context, nset)
    hkv = sums[0].num_kv_heads
    ref = kernel(q, sums[0], *tables, pages, 128 ** -0.5)[0].clone()
    for opts in configs:
        row = dict(shape=shape, batch=bsz, context=context, kernel=kernel.__name__, **opts)
        try:
            launch = dict(opts)
            per_sm = launch.pop("programs_per_sm")
            block = 2 * launch.get("pairs", 4)
            launch["chunk_pages"] = chunk_pages_for(bsz * hkv, pages, q.device, block, per_sm)
            got = kernel(q, sums[0], *tables, pages, 128 ** -0.5, **launch)[0]
            row["max_score_diff"] = (got - ref).abs().max().item()

            def many():
                for i in range(20):
                    kernel(q, sums[i % nset], *tables, pages, 128 ** -0.5, **launch)
            with score_launched_alone():
                us = graph_ms(many, 30) * 1e3 / 20
            row.update(us=round(us, 2), copy_fraction=round(moved / us / 1e3 / copy, 3), chunk_pages=launch["chunk_pages"])
        except Exception:
            row["error"] = traceback.format_exc()[-500:]
        rows.append(row)
        print(row, flush=True)
        json.dump(dict(gpu=torch.cuda.get_device_name(), copy_gbs=copy, rows=rows),
                  open(os.path.join(OUT, "score_heads_sweep.json"), "w"), indent=1)


heads = [dict(pairs=p, stages=s, programs_per_sm=n) for p, s, n in itertools.product((2, 4, 8), (2, 3, 4), (8, 12))]
for bsz, context in ((1, 1048576), (1, 262144), (1, 131072)):
    sweep("glm4-9b-1m", bsz, context, score_pages_gluon_heads, heads)
    torch.cuda.empty_cache()
pages_kernel = [dict(programs_per_sm=n) for n in (4, 6, 8, 10, 12, 16)]
for bsz, context in ((1, 131072), (1, 262144)):
    sweep("llama3.1-8b", bsz, context, score_pages_gluon, pages_kernel)
    torch.cuda.empty_cache()
