"""H200: the LOCKS attention step (score, select, sparse decode of every layer, one CUDA graph) under settings of
one of the decode chain's environment knobs, alternated in one process on the same inputs.

    python benchmarks/trials/pdl_ab.py OUT.json [--env NAME] [VALUE ...]

NAME: the knob, SGLANG_LOCKS_PDL (programmatic dependent launch) by default, or SGLANG_LOCKS_L2_KEEP. VALUE: its
settings to alternate (default: 0 1; for SGLANG_LOCKS_PDL a comma-separated list names the kernels launched so),
three rounds each; the outputs of every setting must equal the first's."""
import json, os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from attention_decode import SHAPES, graph_ms, random_summaries
from sglang_locks.config import LocksConfig
from sglang_locks.decode import LocksDecode

out_path = sys.argv[1]
env = "SGLANG_LOCKS_PDL"
modes = sys.argv[2:]
if modes[:1] == ["--env"]:
    env, modes = modes[1], modes[2:]
modes = modes or ["0", "1"]
CASES = (("llama3.1-8b", 1, 131072), ("llama3.1-8b", 1, 262144), ("llama3.1-8b", 4, 131072),
         ("llama3.1-8b", 8, 131072), ("glm4-9b-1m", 1, 131072), ("glm4-9b-1m", 1, 1048576))
rows = []
cfg = LocksConfig()
for shape, bsz, context in CASES:
    layers, hkv, hq, d = SHAPES[shape]
    slots = bsz * context + 16
    n_kv = max(1, min(layers, int(40 * 2**30 // (slots * hkv * d * 4))))
    ks = [torch.empty(slots, hkv, d, device="cuda", dtype=torch.bfloat16).normal_() for _ in range(n_kv)]
    vs = [torch.empty(slots, hkv, d, device="cuda", dtype=torch.bfloat16).normal_() for _ in range(n_kv)]
    sums = [random_summaries(slots // 16, hkv, d, cfg.rank) for _ in range(min(layers, 8))]
    lens_cpu = torch.tensor([context - 37 * i for i in range(bsz)], dtype=torch.int32)
    tables = ((torch.arange(bsz * context, device="cuda", dtype=torch.int32) + 16).view(bsz, context),
              torch.arange(bsz, device="cuda", dtype=torch.int32), lens_cpu.cuda())
    q = torch.randn(bsz, hq, d, device="cuda", dtype=torch.bfloat16)
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    dec = LocksDecode(cfg, workspace, hq, hkv, d, bsz, use_cuda_graph=True)
    dec.plan(lens_cpu, torch.bfloat16, torch.bfloat16, d**-0.5)
    out = torch.empty_like(q)

    def step():  # LocksDecode.run into one buffer: the last layer's output is compared
        for layer in range(layers):
            dec.select(q, sums[layer % len(sums)], *tables)
            dec.sparse.run(q, ks[layer % n_kv], vs[layer % n_kv], out=out)

    times = {m: [] for m in modes}
    ref = None
    for _ in range(3):
        for m in modes:
            os.environ[env] = m
            times[m].append(graph_ms(step, 40))
            if ref is None:
                ref = out.clone()
            assert torch.equal(out, ref), (shape, bsz, context, m)
    row = {"shape": shape, "batch": bsz, "context": context, "ms": times,
           "median_ms": {m: sorted(t)[1] for m, t in times.items()}, "outputs_equal": True}
    row["saving_us_per_layer"] = {m: (row["median_ms"][modes[0]] - row["median_ms"][m]) * 1e3 / layers for m in modes}
    print(json.dumps(row), flush=True)
    rows.append(row)
    del ks, vs, sums, dec, workspace, out
    torch.cuda.empty_cache()
    json.dump({"gpu": torch.cuda.get_device_name(), "git": os.environ.get("GIT_REV", ""),
               "date": os.environ.get("DATE", ""),
               "command": f"python benchmarks/trials/pdl_ab.py OUT.json --env {env} " + " ".join(modes),
               "rows": rows}, open(out_path, "w"), indent=1)
