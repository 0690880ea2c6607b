"""H200: the LOCKS attention step (every layer, one CUDA graph, as select_ab.py) with each query head's mass added
up by the Gluon score kernel for the selection (the tree: LocksDecode's default) against the selection merging
the score kernel's chunk partials (scoring.MASS_MIN_GROUP beyond any group: the path before it), alternated ROUNDS times
in one process. The two normalise the GQA aggregation by logs of the same sums taken in another order (float64
atomics against float32 merges), so a page whose key sits on a rounding boundary may change sides: the rows
report how many of the last layer's page entries differ and how far the outputs are apart.

    [MIN_GROUP=1] [SLOTS=1,32] python benchmarks/trials/mass_ab.py OUT.json [SHAPE:BATCH:CONTEXT ...]

(SLOTS: also the tree with that many mass slots a query head. The tree adds up masses from
scoring.MASS_MIN_GROUP query heads per KV head, below it "mass" is "partials"; MIN_GROUP overrides it.)
"""
import json, os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_decode import graph_ms
from probe_inputs import ChainStep, save_rows
import sglang_locks.scoring as scoring
from sglang_locks.kernels.selected_indices import MASS_SLOTS

ROUNDS = 5
MIN_GROUP = int(os.environ.get("MIN_GROUP", scoring.MASS_MIN_GROUP))
SLOTS = [int(s) for s in os.environ.get("SLOTS", "").split(",") if s]  # other slot counts to time
# mode: (scoring.MASS_MIN_GROUP, mass slots a query head); "partials": no group adds masses
MODES = {"partials": (10**9, MASS_SLOTS), "mass": (MIN_GROUP, MASS_SLOTS),
         **{f"mass{s}": (MIN_GROUP, s) for s in SLOTS}}

out_path = sys.argv[1]
cases = [(s, int(b), int(n)) for s, b, n in (c.split(":") for c in sys.argv[2:])] or [
    ("llama3.1-8b", 1, 131072), ("llama3.1-8b", 1, 262144), ("llama3.1-8b", 4, 131072), ("llama3.1-8b", 8, 131072),
    ("glm4-9b-1m", 1, 131072), ("glm4-9b-1m", 1, 1048576), ("glm4-9b-1m", 8, 262144)]
rows = []
for shape, bsz, context in cases:
    chain = ChainStep(shape, [context + 32 - 37 * i for i in range(bsz)], max_pages=(context + 1024) // 16)
    state = chain.dec.selection_state
    buffers = {s: torch.zeros(state.mass.shape[0], s, dtype=torch.float64, device="cuda") for _, s in MODES.values()}
    times = {name: [] for name in MODES}
    outs, entries = {}, {}
    for _ in range(ROUNDS):
        for name, (min_group, slots) in MODES.items():
            scoring.MASS_MIN_GROUP, state.mass = min_group, buffers[slots]
            times[name].append(graph_ms(chain.run, 40))
            outs[name] = chain.out.clone()
            entries[name] = chain.dec.sparse.indices[: int(chain.dec.sparse.indptr[chain.rows])].clone()
    med = {m: sorted(t)[ROUNDS // 2] for m, t in times.items()}
    row = {"shape": shape, "batch": bsz, "context": context, "ms": times, "median_ms": med,
           "saving_us_per_layer": {m: (med["partials"] - t) * 1e3 / chain.layers for m, t in med.items()},
           "last_layer_entries": entries["mass"].numel(),
           "last_layer_entries_differing": {m: int((e != entries["partials"]).sum()) for m, e in entries.items()},
           "outputs_max_abs_diff": {m: float((o.float() - outs["partials"].float()).abs().max())
                                    for m, o in outs.items()},
           "mass_cleared": not any(b.any() for b in buffers.values())}
    print(json.dumps(row), flush=True)
    rows.append(row)
    del chain
    torch.cuda.empty_cache()
    save_rows(out_path, "python benchmarks/trials/mass_ab.py OUT.json " + " ".join(sys.argv[2:]), rows)
