"""H200: where the decode step's keys and values go into the cache, in the LOCKS attention step of every layer (one
CUDA graph), alternated in one process on the same inputs:

  store:  SGLang's own store launch (sglang.kernels.ops.kvcache.store_cache, what set_kv_buffer runs), then score,
          select, sparse decode and merge, as before the selection wrote them;
  select: the selection writes them (CacheWrite), no store launch.

    [CASES=shape:batch:context,...] python benchmarks/trials/kv_write_ab.py OUT.json

Three rounds each; both must give the same outputs and caches."""
import json, os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_decode import graph_ms
from probe_inputs import ChainStep, save_rows
from sglang.kernels.ops.kvcache.kvcache import store_cache
from sglang_locks.kernels.selected_indices import CacheWrite

CASES = (("llama3.1-8b", 1, 131072), ("llama3.1-8b", 1, 262144), ("llama3.1-8b", 4, 131072),
         ("glm4-9b-1m", 1, 1048576))
if os.environ.get("CASES"):
    CASES = [(s, int(b), int(c)) for s, b, c in (case.split(":") for case in os.environ["CASES"].split(","))]
MODES = ("store", "select")
rows = []
for shape, bsz, context in CASES:
    lens = [context - 37 * i for i in range(bsz)]
    chain = ChainStep(shape, lens)
    hkv, d = chain.ks[0].shape[1:]
    longest = max(lens)
    # each request's last token: ChainStep puts request b's tokens at slots 16 + b * longest + t
    loc = torch.tensor([16 + b * longest + n - 1 for b, n in enumerate(lens)], device="cuda", dtype=torch.int64)
    new = [(torch.randn(bsz, 3, hkv, d, device="cuda", dtype=torch.bfloat16)) for _ in range(chain.layers)]
    mode = {"now": MODES[0]}

    def run():
        for layer in range(chain.layers):
            k, v = new[layer][:, 1], new[layer][:, 2]  # strided, as SGLang's split of qkv leaves them
            kc, vc = chain.ks[layer % chain.n_kv], chain.vs[layer % chain.n_kv]
            write = None
            if mode["now"] == "store":
                store_cache(k.reshape(bsz, hkv * d), v.reshape(bsz, hkv * d), kc.view(-1, hkv * d),
                            vc.view(-1, hkv * d), loc)
            else:
                write = CacheWrite(k, v, kc, vc, loc)
            chain.dec.select(chain.q, chain.sums[layer % len(chain.sums)], *chain.tables, cache_write=write)
            chain.dec.sparse.run(chain.q, kc, vc, out=chain.out)

    times = {m: [] for m in MODES}
    ref = None
    for _ in range(3):
        for m in MODES:
            mode["now"] = m
            for kc, vc in zip(chain.ks, chain.vs):
                kc[loc], vc[loc] = 0.0, 0.0
            times[m].append(graph_ms(run, 40))
            got = (chain.out.clone(), torch.stack([kc[loc] for kc in chain.ks]), torch.stack([vc[loc] for vc in chain.vs]))
            if ref is None:
                ref = got
            assert all(torch.equal(a, b) for a, b in zip(got, ref)), (shape, bsz, context, m)
    row = {"shape": shape, "batch": bsz, "context": context, "ms": times,
           "median_ms": {m: sorted(t)[1] for m, t in times.items()}, "outputs_equal": True}
    row["saving_us_per_layer"] = (row["median_ms"]["store"] - row["median_ms"]["select"]) * 1e3 / chain.layers
    print(json.dumps(row), flush=True)
    rows.append(row)
    del chain, new
    torch.cuda.empty_cache()
    cases = f"CASES={os.environ['CASES']} " if os.environ.get("CASES") else ""
    save_rows(sys.argv[1], f"{cases}python benchmarks/trials/kv_write_ab.py OUT.json", rows)
