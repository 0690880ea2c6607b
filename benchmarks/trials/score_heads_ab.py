"""H200 A/B (branch gluon-heads-rows): score_pages_gluon_heads (G = 16, heads on the rows) against score_pages_gluon,
alternated in one process, distinct summaries per launch, 20 launches per graph.
    OUT=DIR python benchmarks/trials/score_heads_ab.py"""
import json, os, sys
import torch
sys.path.insert(0, "benchmarks")
from attention_decode import copy_bandwidth_gbs, graph_ms, score_launched_alone
sys.path.insert(0, "benchmarks/trials")
from probe_inputs import score_inputs
from sglang_locks.kernels.score_pages_gluon import score_pages_gluon
from sglang_locks.kernels.score_pages_gluon_heads import score_pages_gluon_heads

OUT = os.environ.get("OUT", "/tmp")
rows = []
copy = copy_bandwidth_gbs()
for bsz, context in ((1, 1048576), (1, 262144), (1, 131072), (8, 262144)):
    pages = context // 16
    nset = 4 if bsz * context <= 262144 else 2
    sums, tables, q, moved = score_inputs("glm4-9b-1m", bsz, context, nset)
    a, b = score_pages_gluon_heads(q, sums[0], *tables, pages, 128 ** -0.5), score_pages_gluon(q, sums[0], *tables, pages, 128 ** -0.5)
    times = {"heads": [], "pages": []}
    for _ in range(3):
        for name, fn in (("heads", score_pages_gluon_heads), ("pages", score_pages_gluon)):
            def many(fn=fn, sums=sums, nset=nset):
                for i in range(20):
                    fn(q, sums[i % nset], *tables, pages, 128 ** -0.5)
            with score_launched_alone():
                times[name].append(graph_ms(many, 30) * 1e3 / 20)
    row = dict(shape="glm4-9b-1m", batch=bsz, context=context, max_score_diff=(a[0] - b[0]).abs().max().item(),
               **{f"{k}_us": round(sorted(v)[1], 2) for k, v in times.items()},
               **{f"{k}_copy_fraction": round(moved / sorted(v)[1] / 1e3 / copy, 3) for k, v in times.items()})
    rows.append(row)
    print(row, flush=True)
    json.dump({"gpu": torch.cuda.get_device_name(), "copy_gbs": copy, "rows": rows},
              open(os.path.join(OUT, "score_heads_ab.json"), "w"), indent=1)
    del sums
    torch.cuda.empty_cache()
