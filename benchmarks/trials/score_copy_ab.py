"""H200 A/B: score_pages_gluon against an earlier revision of it, alternated in one process, distinct summaries per
launch, 20 launches per graph. The base is a scratch copy:

    git show f9d8307:kernels/score_pages_gluon.py > kernels/_score_pages_gluon_base.py
    OUT=DIR python benchmarks/trials/score_copy_ab.py     (then delete the copy)

(score_mu_swizzle_ab_s15.json: the centroid swizzle alone against f9d8307; score_copy_ab_245011d.json: 245011d.)"""
import json, os, sys
import torch
sys.path.insert(0, "benchmarks")
from attention_decode import SHAPES, copy_bandwidth_gbs, graph_ms
sys.path.insert(0, "benchmarks/trials")
from probe_inputs import score_inputs
from sglang_locks.kernels.score_pages_gluon import score_pages_gluon as new
from sglang_locks.kernels._score_pages_gluon_base import score_pages_gluon as base

OUT = os.environ.get("OUT", "/tmp")
rows = []
copy = copy_bandwidth_gbs()
for shape, bsz, context in (("llama3.1-8b", 1, 131072), ("llama3.1-8b", 1, 262144), ("llama3.1-8b", 8, 131072),
                            ("glm4-9b-1m", 1, 1048576), ("glm4-9b-1m", 1, 131072)):
    _, hkv, hq, d = SHAPES[shape]
    pages = context // 16
    nset = 4 if bsz * context <= 262144 else 2
    sums, tables, q, moved = score_inputs(shape, bsz, context, nset)
    a, b = new(q, sums[0], *tables, pages, d ** -0.5), base(q, sums[0], *tables, pages, d ** -0.5)
    same = all(torch.equal(x, y) for x, y in zip(a, b))
    times = {"swizzled": [], "base": []}
    for _ in range(3):
        for name, fn in (("swizzled", new), ("base", base)):
            def many(fn=fn, sums=sums, nset=nset):
                for i in range(20):
                    fn(q, sums[i % nset], *tables, pages, d ** -0.5)
            times[name].append(graph_ms(many, 30) * 1e3 / 20)
    row = dict(shape=shape, batch=bsz, context=context, outputs_equal=same,
               **{f"{k}_us": round(sorted(v)[1], 2) for k, v in times.items()},
               **{f"{k}_copy_fraction": round(moved / sorted(v)[1] / 1e3 / copy, 3) for k, v in times.items()})
    rows.append(row)
    print(row, flush=True)
    json.dump({"gpu": torch.cuda.get_device_name(), "copy_gbs": copy, "rows": rows},
              open(os.path.join(OUT, "mu_swizzle_ab.json"), "w"), indent=1)
    del sums
    torch.cuda.empty_cache()
