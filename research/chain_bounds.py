"""H200: what each stage of the LOCKS attention step costs inside the chain, and so what removing or fusing a stage
could save at most. The attention step of every layer (probe_inputs.ChainStep, one CUDA graph) in parts, alternated
ROUNDS times in one process:

  full            score, select, sparse decode (LocksDecode's step)
  score           the score kernel alone
  score_select    score and select (no sparse decode)
  score_attend    score and the sparse decode of the entries a full step left (no selection)
  attend          the sparse decode alone
  *_thrash        the same with a THRASH_MB device copy after each layer, standing in for the weights a real
                  layer streams through L2 between two attention steps (thrash: the copies alone)

so that, e.g., full - score_attend is what the selection adds to the step. The score-only and no-select modes leave
the score kernel's mass slots (8+ query heads per KV head) unread; they are zeroed after them.

    python research/chain_bounds.py OUT.json [SHAPE:BATCH:CONTEXT ...]
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_inputs import ChainStep, save_rows  # noqa: E402

ROUNDS = 3
THRASH_MB = int(os.environ.get("THRASH_MB", "400"))


def modes(chain: ChainStep, src: torch.Tensor, dst: torch.Tensor) -> dict:
    dec, q, sums = chain.dec, chain.q, chain.sums

    def select(layer):
        dec.select(q, sums[layer % len(sums)], *chain.tables)

    def attend(layer):
        dec.sparse.run(q, chain.ks[layer % chain.n_kv], chain.vs[layer % chain.n_kv], out=chain.out)

    parts = {"full": (select, attend), "score": (chain.score,), "score_select": (select,),
             "score_attend": (chain.score, attend), "attend": (attend,)}

    def thrash():
        dst.copy_(src)

    out = {name: chain.every_layer(fns) for name, fns in parts.items()}
    out.update({f"{name}_thrash": chain.every_layer(fns, thrash) for name, fns in parts.items()
                if name in ("full", "score_attend", "score_select")})
    out["thrash"] = chain.every_layer((), thrash)
    return out


def main():
    out_path = sys.argv[1]
    cases = [(s, int(b), int(n)) for s, b, n in (c.split(":") for c in sys.argv[2:])] or [
        ("llama3.1-8b", 1, 131072), ("llama3.1-8b", 1, 262144), ("glm4-9b-1m", 1, 1048576)]
    src = torch.empty(THRASH_MB << 20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    rows = []
    for shape, bsz, context in cases:
        chain = ChainStep(shape, [context + 32 - 37 * i for i in range(bsz)], max_pages=(context + 1024) // 16)
        chain.run()  # entries for the no-select modes
        torch.cuda.synchronize()
        times, us = chain.alternate(modes(chain, src, dst), ROUNDS)
        derived = {
            "select_in_chain": round(us["full"] - us["score_attend"], 2),
            "attend_in_chain": round(us["full"] - us["score_select"], 2),
            "full_with_thrash": round(us["full_thrash"] - us["thrash"], 2),
            "select_in_chain_with_thrash": round(us["full_thrash"] - us["score_attend_thrash"], 2),
            "attend_in_chain_with_thrash": round(us["full_thrash"] - us["score_select_thrash"], 2),
        }
        row = {"shape": shape, "batch": bsz, "context": context, "ms": times, "us_per_layer": us,
               "derived_us_per_layer": derived}
        print(json.dumps({k: v for k, v in row.items() if k != "ms"}), flush=True)
        rows.append(row)
        del chain
        torch.cuda.empty_cache()
        save_rows(out_path, "python research/chain_bounds.py OUT.json " + " ".join(sys.argv[2:]), rows,
                  thrash_mb=THRASH_MB)


if __name__ == "__main__":
    main()
