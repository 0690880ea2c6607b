"""Ran against score_pages_gluon with a maxnreg launch option (passed to the launch; removed: no gain,
score_maxnreg_probe_s15.json); it no longer runs on main. score_pages_gluon at G = 16 by register cap (maxnreg) and
programs per SM; distinct summaries per launch,
20 launches per graph.  OUT=DIR python benchmarks/trials/score_maxnreg_probe.py"""
import json, os, sys, traceback
import torch
import triton
sys.path.insert(0, "benchmarks")
from attention_decode import SHAPES, copy_bandwidth_gbs, graph_ms, random_summaries
from sglang_locks.kernels.score_pages_gluon import score_pages_gluon
from sglang_locks.kernels._triton import num_sms

OUT = os.environ.get("OUT", "/tmp")
rows = []
copy = copy_bandwidth_gbs()
sms = num_sms(torch.device("cuda"))
VARIANTS = [(None, 8), (168, 8), (168, 12), (160, 12), (152, 12), (144, 13), (128, 13), (None, 8)]
for shape, bsz, context in (("glm4-9b-1m", 1, 1048576), ("glm4-9b-1m", 1, 262144), ("glm4-9b-1m", 8, 262144),
                            ("glm4-9b-1m", 1, 131072)):
    _, hkv, hq, d = SHAPES[shape]
    pages = context // 16
    nset = 4 if bsz * context <= 262144 else 2
    sums = [random_summaries(bsz * pages + 2, hkv, d, 8) for _ in range(nset)]
    req_to_token = (torch.arange(bsz * context, device="cuda", dtype=torch.int32) + 16).view(bsz, context)
    tables = (req_to_token, torch.arange(bsz, device="cuda", dtype=torch.int32),
              torch.full((bsz,), context, device="cuda", dtype=torch.int32))
    q = torch.randn(bsz, hq, d, device="cuda", dtype=torch.bfloat16)
    moved = bsz * hkv * pages * sums[0].bytes_per_page_per_head() + bsz * pages * 4 * (1 + hq)
    ref = score_pages_gluon(q, sums[0], *tables, pages, d ** -0.5)
    for maxnreg, pps in VARIANTS:
        blocks = triton.cdiv(pages, 8)
        per_row = max(1, min(blocks, triton.cdiv(pps * sms, bsz * hkv)))
        chunk = triton.cdiv(blocks, per_row) * 8
        try:
            got = score_pages_gluon(q, sums[0], *tables, pages, d ** -0.5, chunk_pages=chunk, maxnreg=maxnreg)
            def many(sums=sums, chunk=chunk, nset=nset, maxnreg=maxnreg):
                for i in range(20):
                    score_pages_gluon(q, sums[i % nset], *tables, pages, d ** -0.5, chunk_pages=chunk, maxnreg=maxnreg)
            us = graph_ms(many, 30) * 1e3 / 20
            rows.append(dict(shape=shape, batch=bsz, context=context, maxnreg=maxnreg, programs_per_sm=pps,
                             chunk_pages=chunk, us=round(us, 2), copy_fraction=round(moved / us / 1e3 / copy, 3),
                             scores_max_diff=(got[0] - ref[0]).abs().max().item()))
        except Exception:
            rows.append(dict(shape=shape, batch=bsz, context=context, maxnreg=maxnreg, error=traceback.format_exc()[-600:]))
        print(rows[-1], flush=True)
        json.dump({"gpu": torch.cuda.get_device_name(), "copy_gbs": copy, "rows": rows},
                  open(os.path.join(OUT, "score_maxnreg_probe.json"), "w"), indent=1)
    del sums
    torch.cuda.empty_cache()
