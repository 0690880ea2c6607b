"""score_pages_gluon by programs per SM (pages per program), distinct summaries per launch (4 sets rotated),
20 launches per graph, CUDA-graph medians.  OUT=DIR python benchmarks/trials/score_chunk_probe.py"""
import json, os, sys, traceback
import torch
import triton
sys.path.insert(0, "benchmarks")
from attention_decode import SHAPES, copy_bandwidth_gbs, graph_ms, score_launched_alone
sys.path.insert(0, "benchmarks/trials")
from probe_inputs import score_inputs
from sglang_locks.kernels.score_pages_gluon import score_pages_gluon
from sglang_locks.kernels.score_pages import chunk_pages_for

OUT = os.environ.get("OUT", "/tmp")
rows = []
copy = copy_bandwidth_gbs()
for shape, bsz, context in (("llama3.1-8b", 1, 131072), ("llama3.1-8b", 1, 262144), ("llama3.1-8b", 1, 1048576),
                            ("llama3.1-8b", 4, 131072), ("llama3.1-8b", 8, 131072), ("glm4-9b-1m", 1, 131072),
                            ("glm4-9b-1m", 1, 1048576)):
    _, hkv, hq, d = SHAPES[shape]
    pages = context // 16
    nset = 4 if bsz * context <= 262144 else 2
    sums, tables, q, moved = score_inputs(shape, bsz, context, nset)
    rows_kv = bsz * hkv
    ref = score_pages_gluon(q, sums[0], *tables, pages, d ** -0.5)[0].clone()
    for pps in (8, 6, 10, 12, 14, 16, 20, 8):
        chunk = chunk_pages_for(rows_kv, pages, q.device, 8, pps)
        try:
            got = score_pages_gluon(q, sums[0], *tables, pages, d ** -0.5, chunk_pages=chunk)[0]
            def many(sums=sums, chunk=chunk, nset=nset):
                for i in range(20):
                    score_pages_gluon(q, sums[i % nset], *tables, pages, d ** -0.5, chunk_pages=chunk)
            with score_launched_alone():
                us = graph_ms(many, 30) * 1e3 / 20
            rows.append(dict(shape=shape, batch=bsz, context=context, programs_per_sm=pps, chunk_pages=chunk,
                             programs=rows_kv * triton.cdiv(pages, chunk), us=round(us, 2),
                             copy_fraction=round(moved / us / 1e3 / copy, 3), scores_equal=bool(torch.equal(got, ref))))
        except Exception:
            rows.append(dict(shape=shape, batch=bsz, context=context, programs_per_sm=pps, error=traceback.format_exc()[-600:]))
        print(rows[-1], flush=True)
        json.dump({"gpu": torch.cuda.get_device_name(), "copy_gbs": copy, "rows": rows},
                  open(os.path.join(OUT, "score_chunk_probe.json"), "w"), indent=1)
    del sums
    torch.cuda.empty_cache()
