"""H200: the LOCKS attention step (every layer, one CUDA graph, as pdl_ab.py) with the selection grid of f62b43c
(selection_parts: the smallest tile whose programs all fit resident) against the rule before it (2 programs per
SM), alternated in one process, outputs compared; score buffers as wide as a server's graph for 1024 more tokens.

    python benchmarks/trials/select_grid_ab.py OUT.json [SHAPE:BATCH:CONTEXT ...]
"""
import json, os, sys
import torch
import triton
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from attention_decode import SHAPES, graph_ms, random_summaries
from sglang_locks.config import LocksConfig
from sglang_locks.decode import LocksDecode
from sglang_locks.kernels import selected_indices as si

new_rule = si.selection_parts


def old_rule(rows, items, device, group, block=None):
    return max(1, min(triton.cdiv(max(items, 1), block or si.PAGE_BLOCK), 2 * si.num_sms(device) // rows))


out_path = sys.argv[1]
cases = [(s, int(b), int(n)) for s, b, n in (c.split(":") for c in sys.argv[2:])] or [
    ("llama3.1-8b", 1, 1048576), ("llama3.1-8b", 4, 131072), ("llama3.1-8b", 8, 131072), ("llama3.1-8b", 4, 262144)]
cfg = LocksConfig()
rows = []
for shape, bsz, context in cases:
    layers, hkv, hq, d = SHAPES[shape]
    slots = bsz * (context + 32) + 16  # requests of up to context + 32 tokens
    n_kv = max(1, min(layers, int(40 * 2**30 // (slots * hkv * d * 4))))
    ks = [torch.empty(slots, hkv, d, device="cuda", dtype=torch.bfloat16).normal_() for _ in range(n_kv)]
    vs = [torch.empty(slots, hkv, d, device="cuda", dtype=torch.bfloat16).normal_() for _ in range(n_kv)]
    sums = [random_summaries(slots // 16, hkv, d, cfg.rank) for _ in range(min(layers, 8))]
    lens_cpu = torch.tensor([context + 32 - 37 * i for i in range(bsz)], dtype=torch.int32)
    tables = ((torch.arange(bsz * (context + 32), device="cuda", dtype=torch.int32) + 16).view(bsz, context + 32),
              torch.arange(bsz, device="cuda", dtype=torch.int32), lens_cpu.cuda())
    q = torch.randn(bsz, hq, d, device="cuda", dtype=torch.bfloat16)
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    dec = LocksDecode(cfg, workspace, hq, hkv, d, bsz, use_cuda_graph=True)
    dec.plan(lens_cpu, torch.bfloat16, torch.bfloat16, d**-0.5, max_pages=(context + 1024) // 16)
    out = torch.empty_like(q)

    def step():
        for layer in range(layers):
            dec.select(q, sums[layer % len(sums)], *tables)
            dec.sparse.run(q, ks[layer % n_kv], vs[layer % n_kv], out=out)

    times = {"old": [], "new": []}
    ref = None
    for _ in range(3):
        for name, rule in (("old", old_rule), ("new", new_rule)):
            si.selection_parts = rule
            times[name].append(graph_ms(step, 40))
            if ref is None:
                ref = out.clone()
            assert torch.equal(out, ref), (shape, bsz, context, name)
    si.selection_parts = new_rule
    med = {m: sorted(t)[1] for m, t in times.items()}
    row = {"shape": shape, "batch": bsz, "context": context, "width_pages": dec.max_pages, "ms": times,
           "median_ms": med, "saving_us_per_layer": (med["old"] - med["new"]) * 1e3 / layers, "outputs_equal": True,
           "parts": {"old": old_rule(bsz * hkv, dec.max_pages, q.device, hq // hkv),
                     "new": new_rule(bsz * hkv, dec.max_pages, q.device, hq // hkv)}}
    print(json.dumps(row), flush=True)
    rows.append(row)
    del ks, vs, sums, dec, workspace, out
    torch.cuda.empty_cache()
    json.dump({"gpu": torch.cuda.get_device_name(), "git": os.environ.get("GIT_REV", ""),
               "date": os.environ.get("DATE", ""),
               "command": "python benchmarks/trials/select_grid_ab.py OUT.json " + " ".join(sys.argv[2:]),
               "rows": rows}, open(out_path, "w"), indent=1)
