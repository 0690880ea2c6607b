"""H200: per-kernel times of the LOCKS attention step in place (every layer in one CUDA graph, as in
pdl_ab.py), from torch.profiler over graph replays: what each kernel of the chain takes after the one before
it, with its inputs where that kernel left them (L2 or HBM), unlike attention_decode.py's split, which times
each kernel alone on the same inputs.

    python benchmarks/trials/chain_profile.py OUT.json [SHAPE:BATCH:CONTEXT ...]
"""
import json, os, sys
import torch
from torch.profiler import ProfilerActivity, profile
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from attention_decode import SHAPES, random_summaries
from sglang_locks.config import LocksConfig
from sglang_locks.decode import LocksDecode

out_path = sys.argv[1]
cases = [(s, int(b), int(n)) for s, b, n in (c.split(":") for c in sys.argv[2:])] or [
    ("llama3.1-8b", 1, 131072), ("llama3.1-8b", 4, 131072), ("glm4-9b-1m", 1, 1048576)]
cfg = LocksConfig()
rows = []
for shape, bsz, context in cases:
    layers, hkv, hq, d = SHAPES[shape]
    slots = bsz * context + 16
    n_kv = max(1, min(layers, int(40 * 2**30 // (slots * hkv * d * 4))))
    ks = [torch.empty(slots, hkv, d, device="cuda", dtype=torch.bfloat16).normal_() for _ in range(n_kv)]
    vs = [torch.empty(slots, hkv, d, device="cuda", dtype=torch.bfloat16).normal_() for _ in range(n_kv)]
    sums = [random_summaries(slots // 16, hkv, d, cfg.rank) for _ in range(min(layers, 8))]
    lens_cpu = torch.full((bsz,), context, dtype=torch.int32)
    tables = ((torch.arange(bsz * context, device="cuda", dtype=torch.int32) + 16).view(bsz, context),
              torch.arange(bsz, device="cuda", dtype=torch.int32), lens_cpu.cuda())
    q = torch.randn(bsz, hq, d, device="cuda", dtype=torch.bfloat16)
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    dec = LocksDecode(cfg, workspace, hq, hkv, d, bsz, use_cuda_graph=True)
    dec.plan(lens_cpu, torch.bfloat16, torch.bfloat16, d**-0.5, max_pages=context // 16 + 64)
    out = torch.empty_like(q)
    graph = torch.cuda.CUDAGraph()
    for _ in range(2):  # compile outside the capture
        for layer in range(layers):
            dec.select(q, sums[layer % len(sums)], *tables)
            dec.sparse.run(q, ks[layer % n_kv], vs[layer % n_kv], out=out)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        for layer in range(layers):
            dec.select(q, sums[layer % len(sums)], *tables)
            dec.sparse.run(q, ks[layer % n_kv], vs[layer % n_kv], out=out)
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    reps = 20
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.count >= reps * layers:
            kernels[e.key] = round(e.self_device_time_total / (reps * layers), 2)  # us per layer
    row = {"shape": shape, "batch": bsz, "context": context, "us_per_layer": kernels}
    print(json.dumps(row), flush=True)
    rows.append(row)
    del ks, vs, sums, dec, workspace, out, graph
    torch.cuda.empty_cache()
json.dump({"gpu": torch.cuda.get_device_name(), "git": os.environ.get("GIT_REV", ""), "date": os.environ.get("DATE", ""),
           "command": "python benchmarks/trials/chain_profile.py OUT.json " + " ".join(sys.argv[2:]),
           "note": "with PDL a kernel's span includes its wait for the kernel before it",
           "rows": rows}, open(out_path, "w"), indent=1)
