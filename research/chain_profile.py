"""H200: per-kernel times of the LOCKS attention step in place (every layer in one CUDA graph, as in
pdl_ab.py), from torch.profiler over graph replays: what each kernel of the chain takes after the one before
it, with its inputs where that kernel left them (L2 or HBM), unlike attention_decode.py's split, which times
each kernel alone on the same inputs. Score buffers 64 pages wider than the context, as in a server's graph.

    SGLANG_LOCKS_PDL=0 python research/chain_profile.py OUT.json [SHAPE:BATCH:CONTEXT ...]

(With PDL a kernel's span includes its wait for the kernel before it.)
"""
import json, os, sys
import torch
from torch.profiler import ProfilerActivity, profile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_inputs import ChainStep, save_rows

out_path = sys.argv[1]
cases = [(s, int(b), int(n)) for s, b, n in (c.split(":") for c in sys.argv[2:])] or [
    ("llama3.1-8b", 1, 131072), ("llama3.1-8b", 4, 131072), ("glm4-9b-1m", 1, 1048576)]
rows = []
for shape, bsz, context in cases:
    chain = ChainStep(shape, [context] * bsz, max_pages=context // 16 + 64)
    for _ in range(2):  # compile outside the capture
        chain.run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain.run()
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    reps = 20
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
    kernels = {e.key: round(e.self_device_time_total / (reps * chain.layers), 2)  # us per layer
               for e in prof.key_averages() if e.device_type.name == "CUDA" and e.count >= reps * chain.layers}
    row = {"shape": shape, "batch": bsz, "context": context, "us_per_layer": kernels}
    print(json.dumps(row), flush=True)
    rows.append(row)
    del chain, graph
    torch.cuda.empty_cache()
    save_rows(out_path, "python research/chain_profile.py OUT.json " + " ".join(sys.argv[2:]), rows,
              note="with PDL a kernel's span includes its wait for the kernel before it")
