"""H200: the LOCKS attention step (every layer, one CUDA graph, as pdl_ab.py) with the selection grid of f62b43c
(selection_parts: the smallest tile whose programs all fit resident) against the rule before it (2 programs per
SM), alternated in one process, outputs compared; requests of context + 32 tokens (the first the longest), score
buffers as wide as a server's graph for 1024 more tokens.

    python benchmarks/trials/select_grid_ab.py OUT.json [SHAPE:BATCH:CONTEXT ...]
"""
import json, os, sys
import torch
import triton
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_decode import graph_ms
from probe_inputs import ChainStep, save_rows
from sglang_locks.kernels import selected_indices as si

new_rule = si.selection_parts


def old_rule(rows, items, device, group, block=None):
    return max(1, min(triton.cdiv(max(items, 1), block or si.PAGE_BLOCK), 2 * si.num_sms(device) // rows))


out_path = sys.argv[1]
cases = [(s, int(b), int(n)) for s, b, n in (c.split(":") for c in sys.argv[2:])] or [
    ("llama3.1-8b", 1, 1048576), ("llama3.1-8b", 4, 131072), ("llama3.1-8b", 8, 131072), ("llama3.1-8b", 4, 262144)]
rows = []
for shape, bsz, context in cases:
    chain = ChainStep(shape, [context + 32 - 37 * i for i in range(bsz)], max_pages=(context + 1024) // 16)
    times = {"old": [], "new": []}
    ref = None
    for _ in range(3):
        for name, rule in (("old", old_rule), ("new", new_rule)):
            si.selection_parts = rule
            times[name].append(graph_ms(chain.run, 40))
            if ref is None:
                ref = chain.out.clone()
            assert torch.equal(chain.out, ref), (shape, bsz, context, name)
    si.selection_parts = new_rule
    med = {m: sorted(t)[1] for m, t in times.items()}
    width, device = chain.dec.max_pages, chain.q.device
    row = {"shape": shape, "batch": bsz, "context": context, "width_pages": width, "ms": times,
           "median_ms": med, "saving_us_per_layer": (med["old"] - med["new"]) * 1e3 / chain.layers,
           "outputs_equal": True, "parts": {"old": old_rule(chain.rows, width, device, chain.group),
                                            "new": new_rule(chain.rows, width, device, chain.group)}}
    print(json.dumps(row), flush=True)
    rows.append(row)
    del chain
    torch.cuda.empty_cache()
    save_rows(out_path, "python benchmarks/trials/select_grid_ab.py OUT.json " + " ".join(sys.argv[2:]), rows)
