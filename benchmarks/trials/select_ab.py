"""H200: the LOCKS attention step (every layer, one CUDA graph, as pdl_ab.py) with this tree's selection (kernel
and grid rules of kernels/selected_indices.py) and with other versions of that file, alternated ROUNDS times in
one process, outputs compared; requests of context + 32 tokens (the first the longest), score buffers as wide as
a server's graph for 1024 more tokens. Savings are against the first file.

    python benchmarks/trials/select_ab.py OUT.json OLD_SELECTED_INDICES.py [OTHER.py ...] [SHAPE:BATCH:CONTEXT ...]

(results/select_grid_ab_s21.json: the grid rule of f62b43c against the one before it, by this script's earlier
form select_grid_ab.py at 58c75d9.)
"""
import json, os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_decode import graph_ms
from probe_inputs import ChainStep, load_kernel_version, save_rows
from sglang_locks.kernels import selected_indices as si

ROUNDS = 5
# what _launch_select takes from its module: the kernel and the grid's rules
SWAPPED = ("_select_kernel", "selection_parts", "resident_programs", "selection_tile", "selection_tiles",
           "split_merge")
out_path = sys.argv[1]
files = [a for a in sys.argv[2:] if a.endswith(".py")]
versions = {os.path.basename(f): {n: getattr(load_kernel_version(f"selected_indices_{i}", f), n) for n in SWAPPED}
            for i, f in enumerate(files)}
versions["tree"] = {n: getattr(si, n) for n in SWAPPED}
first = os.path.basename(files[0])


def use(name):
    for n, f in versions[name].items():
        setattr(si, n, f)


cases = [(s, int(b), int(n)) for s, b, n in (c.split(":") for c in sys.argv[2:] if not c.endswith(".py"))] or [
    ("llama3.1-8b", 1, 131072), ("llama3.1-8b", 4, 131072), ("llama3.1-8b", 1, 1048576), ("glm4-9b-1m", 1, 1048576)]
rows = []
for shape, bsz, context in cases:
    chain = ChainStep(shape, [context + 32 - 37 * i for i in range(bsz)], max_pages=(context + 1024) // 16)
    times = {name: [] for name in versions}
    ref = None
    for _ in range(ROUNDS):
        for name in times:
            use(name)
            times[name].append(graph_ms(chain.run, 40))
            if ref is None:
                ref = chain.out.clone()
            assert torch.equal(chain.out, ref), (shape, bsz, context, name)
    width, device = chain.dec.max_pages, chain.q.device
    parts = {}
    for name in times:
        use(name)
        parts[name] = si.selection_parts(chain.rows, width, device, chain.group)
    use("tree")
    med = {m: sorted(t)[ROUNDS // 2] for m, t in times.items()}
    row = {"shape": shape, "batch": bsz, "context": context, "width_pages": width, "ms": times,
           "median_ms": med, "saving_us_per_layer": {m: (med[first] - t) * 1e3 / chain.layers for m, t in med.items()},
           "outputs_equal": True, "parts": parts}
    print(json.dumps(row), flush=True)
    rows.append(row)
    del chain
    torch.cuda.empty_cache()
    save_rows(out_path, "python benchmarks/trials/select_ab.py OUT.json " + " ".join(sys.argv[2:]), rows)
