"""H200: the selection launch under the grid rule of 245011d (PAGE_BLOCK 512, selection_tile) vs the old (1024 pages per program and tile), one layer
repeated 20x in a graph; outputs compared with the shipped setting.  OUT=DIR python benchmarks/trials/select_grid_probe.py"""
import json, os, sys, traceback
import torch
sys.path.insert(0, "benchmarks")
from attention_decode import SHAPES, graph_ms, random_summaries
from sglang_locks.config import LocksConfig
from sglang_locks.decode import LocksDecode
from sglang_locks.scoring import locks_scores_triton
import sglang_locks.kernels.selected_indices as si

OUT = os.environ.get("OUT", "/tmp")
rows = []
SHIPPED = si.PAGE_BLOCK
for shape, bsz, context in (("llama3.1-8b", 1, 131072), ("llama3.1-8b", 1, 262144), ("llama3.1-8b", 1, 1048576),
                            ("llama3.1-8b", 4, 131072), ("glm4-9b-1m", 1, 131072), ("glm4-9b-1m", 1, 1048576)):
    _, hkv, hq, d = SHAPES[shape]
    cfg = LocksConfig(token_budget=2048)
    sums = random_summaries(bsz * context // 16 + 2, hkv, d, cfg.rank)
    req_to_token = (torch.arange(bsz * context, device="cuda", dtype=torch.int32) + 16).view(bsz, context)
    tables = (req_to_token, torch.arange(bsz, device="cuda", dtype=torch.int32),
              torch.full((bsz,), context, device="cuda", dtype=torch.int32))
    q = torch.randn(bsz, hq, d, device="cuda", dtype=torch.bfloat16)
    ws = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")
    dec = LocksDecode(cfg, ws, hq, hkv, d, bsz, use_cuda_graph=True)
    dec.plan(torch.full((bsz,), context, dtype=torch.int32), torch.bfloat16, torch.bfloat16, d ** -0.5)
    # the selections merge the score partials (repeated on one launch's scores, they cannot take its masses)
    *parts, cand, _ = locks_scores_triton(q, sums, *tables, dec.max_pages, dec.sm_scale, cfg, dec.selection_state)
    sp = dec.sparse
    ref = None
    new_tile = si.selection_tile
    for block in ("new", "old", "new", "old"):
        si.PAGE_BLOCK = SHIPPED if block == "new" else 1024
        si.selection_tile = new_tile if block == "new" else (lambda items, parts, group: 1024)
        try:
            def sel():
                si.selected_indices_triton(*parts, *tables, sp.indptr, sp.indices, sp.last_page_len, hkv, cfg.sink_pages,
                                           cfg.local_pages, cfg.gqa_aggregation, cfg.budget_pages, dec.selection_state)
            sel()
            torch.cuda.synchronize()
            n = int(sp.indptr[bsz * hkv])
            got = sp.indices[:n].clone()
            if ref is None:
                ref = got
            def many():
                for _ in range(20):
                    sel()
            us = graph_ms(many, 30) * 1e3 / 20
            rows.append(dict(shape=shape, batch=bsz, context=context, page_block=block,
                             parts=si.selection_parts(bsz * hkv, dec.max_pages, q.device, hq // hkv), us=round(us, 2),
                             same_as_shipped=bool(torch.equal(got, ref))))
        except Exception:
            rows.append(dict(shape=shape, batch=bsz, context=context, page_block=block, error=traceback.format_exc()[-600:]))
        print(rows[-1], flush=True)
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, open(os.path.join(OUT, "select_probe.json"), "w"), indent=1)
    si.PAGE_BLOCK = SHIPPED
    si.selection_tile = new_tile
    del sums
    torch.cuda.empty_cache()
