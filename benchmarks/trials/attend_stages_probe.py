"""H200 probe (session 16, negative): the Triton sparse decode's first launch with num_stages 1 / 2 / 3 and num_warps 4 / 2,
against FlashInfer's wrapper, same inputs (probe_inputs.attend_inputs). OUT=DIR python benchmarks/trials/attend_stages_probe.py"""
import json, os, sys
import torch
sys.path.insert(0, "benchmarks"); sys.path.insert(0, "benchmarks/trials")
from attention_decode import graph_ms
from probe_inputs import attend_inputs
from sglang_locks.kernels import sparse_attend as sa

OUT = os.environ.get("OUT", "/tmp")
rows_out = []
for shape, hkv, hq, bsz, inner in (("llama", 8, 32, 1, 20), ("glm", 2, 32, 1, 20), ("llama", 8, 32, 4, 12)):
    q, views, w, n = attend_inputs(hkv, hq, bsz, inner, kernel="flashinfer")
    rows = bsz * hkv
    g = hq // hkv
    ref = w.run(q, *views[0]).float()
    fi = graph_ms(lambda: [w.run(q, kk, vv) for kk, vv in views], 30) * 1e3 / inner
    splits, ppi = sa.attend_launch(rows, n // rows, torch.cuda.get_device_properties(0).multi_processor_count)
    bufs = sa.SparseAttendBuffers.allocate(rows * splits, g, 128, "cuda")
    out = torch.empty_like(q)
    res = dict(shape=shape, batch=bsz, flashinfer_us=round(fi, 2), splits=splits, pages_per_iter=ppi, variants=[])
    for stages in (1, 2, 3):
        for warps in (4, 2):
            def run(kk, vv, stages=stages, warps=warps):
                sa._attend_part[(rows, splits)](q, kk, vv, w.indptr, w.indices, w.last_page_len, out, bufs.part_o,
                                                bufs.part_lse, 128 ** -0.5 * sa.LOG2E, HKV=hkv, G=g, GP=max(16, g),
                                                D=128, DP=128, PAGES=ppi, SPLITS=splits, DOT_F32=False,
                                                num_warps=warps, num_stages=stages)
                sa._merge_parts[(rows, g)](bufs.part_o, bufs.part_lse, out, G=g, D=128, DP=128, SPLITS=splits,
                                           num_warps=4)
            run(*views[0])
            diff = (out.float() - ref).abs().max().item()
            us = graph_ms(lambda: [run(kk, vv) for kk, vv in views], 30) * 1e3 / inner
            res["variants"].append(dict(num_stages=stages, num_warps=warps, us=round(us, 2), max_diff=round(diff, 4)))
    rows_out.append(res)
    print(res, flush=True)
    json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows_out}, open(os.path.join(OUT, "attend_stages_probe.json"), "w"), indent=1)
    views = None  # free the caches before the next case
    torch.cuda.empty_cache()
