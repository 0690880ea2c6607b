"""H200: the LOCKS attention step (score, select, sparse decode of every layer, one CUDA graph) under settings of
one of the decode chain's environment knobs, alternated in one process on the same inputs.

    [CASES=shape:batch:context,...] python research/pdl_ab.py OUT.json [--env NAME] [VALUE ...]

NAME: the knob, SGLANG_LOCKS_PDL (programmatic dependent launch) by default, or SGLANG_LOCKS_L2_KEEP. VALUE: its
settings to alternate (default: 0 1; for SGLANG_LOCKS_PDL a comma-separated list names the kernels launched so),
three rounds each; the outputs of every setting must equal the first's."""
import json, os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_decode import graph_ms
from probe_inputs import ChainStep, save_rows

out_path = sys.argv[1]
env = "SGLANG_LOCKS_PDL"
modes = sys.argv[2:]
if modes[:1] == ["--env"]:
    env, modes = modes[1], modes[2:]
modes = modes or ["0", "1"]
CASES = (("llama3.1-8b", 1, 131072), ("llama3.1-8b", 1, 262144), ("llama3.1-8b", 4, 131072),
         ("llama3.1-8b", 8, 131072), ("glm4-9b-1m", 1, 131072), ("glm4-9b-1m", 1, 1048576))
if os.environ.get("CASES"):
    CASES = [(s, int(b), int(c)) for s, b, c in (case.split(":") for case in os.environ["CASES"].split(","))]
rows = []
for shape, bsz, context in CASES:
    chain = ChainStep(shape, [context - 37 * i for i in range(bsz)])
    times = {m: [] for m in modes}
    ref = None
    for _ in range(3):
        for m in modes:
            os.environ[env] = m
            times[m].append(graph_ms(chain.run, 40))
            if ref is None:
                ref = chain.out.clone()
            assert torch.equal(chain.out, ref), (shape, bsz, context, m)
    row = {"shape": shape, "batch": bsz, "context": context, "ms": times,
           "median_ms": {m: sorted(t)[1] for m, t in times.items()}, "outputs_equal": True}
    row["saving_us_per_layer"] = {m: (row["median_ms"][modes[0]] - row["median_ms"][m]) * 1e3 / chain.layers
                                  for m in modes}
    print(json.dumps(row), flush=True)
    rows.append(row)
    del chain
    torch.cuda.empty_cache()
    cases = f"CASES={os.environ['CASES']} " if os.environ.get("CASES") else ""
    save_rows(out_path, f"{cases}python research/pdl_ab.py OUT.json --env {env} " + " ".join(modes), rows)
