"""H200 A/B of versions of kernels/score_pages_gluon.py (and the heads kernel built on each), alternated in one
process: one layer alone (distinct summaries per launch, CUDA-graph medians of 20 launches) and the attention
step of all layers (ChainStep, the score kernels swapped in sglang_locks.scoring). The first version is the base:
every other version's scores must equal its bits, and the chain's outputs its outputs.

    python benchmarks/trials/score_copy_layout_ab.py OUT.json NAME=FILE [NAME=FILE ...]   (from the repository root)
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_decode import copy_bandwidth_gbs, graph_ms, score_launched_alone  # noqa: E402
from probe_inputs import ChainStep, load_kernel_version, save_rows, score_inputs  # noqa: E402
from sglang_locks import scoring  # noqa: E402
from sglang_locks.kernels import score_pages_gluon_heads  # noqa: E402

HEADS = score_pages_gluon_heads.__file__


def load(name, path):
    """(score_pages_gluon, score_pages_gluon_heads) of the version at path."""
    gluon = load_kernel_version(f"score_pages_gluon_{name}", path)
    heads_src = open(HEADS).read().replace("from .score_pages_gluon import", f"from .score_pages_gluon_{name} import")
    heads_path = f"/tmp/score_pages_gluon_heads_{name}.py"
    open(heads_path, "w").write(heads_src)
    return gluon.score_pages_gluon, load_kernel_version(f"score_pages_gluon_heads_{name}", heads_path).score_pages_gluon_heads


def main():
    out_path = sys.argv[1]
    versions = {n: load(n, p) for n, p in (a.split("=", 1) for a in sys.argv[2:])}
    names = list(versions)
    copy = copy_bandwidth_gbs()
    rows = []
    for shape, bsz, context in (("glm4-9b-1m", 1, 1048576), ("glm4-9b-1m", 1, 262144), ("llama3.1-8b", 1, 131072),
                                ("llama3.1-8b", 1, 262144), ("llama3.1-8b", 8, 131072), ("glm4-9b-1m", 8, 262144)):
        sums, tables, q, moved = score_inputs(shape, bsz, context, 2)
        pages = context // 16
        heads = q.shape[1] // sums[0].num_kv_heads == 16
        pick = {n: v[1] if heads else v[0] for n, v in versions.items()}
        ref = pick[names[0]](q, sums[0], *tables, pages, 128 ** -0.5)
        for n in names[1:]:
            got = pick[n](q, sums[0], *tables, pages, 128 ** -0.5)
            assert all(torch.equal(a, b) for a, b in zip(ref[:3], got[:3])), (shape, bsz, context, n)
        times = {n: [] for n in names}
        for _ in range(3):
            for n in names:
                def many(fn=pick[n]):
                    for i in range(20):
                        fn(q, sums[i % 2], *tables, pages, 128 ** -0.5)
                with score_launched_alone():
                    times[n].append(graph_ms(many, 30) * 1e3 / 20)
        row = dict(part="one layer", shape=shape, batch=bsz, context=context, scores_equal=True,
                   us={n: round(sorted(t)[1], 2) for n, t in times.items()},
                   copy_fraction={n: round(moved / sorted(t)[1] / 1e3 / copy, 3) for n, t in times.items()})
        print(json.dumps(row), flush=True)
        rows.append(row)
        del sums
        torch.cuda.empty_cache()
    for shape, bsz, context in (("llama3.1-8b", 1, 131072), ("llama3.1-8b", 1, 262144), ("llama3.1-8b", 4, 131072),
                                ("glm4-9b-1m", 1, 1048576), ("glm4-9b-1m", 1, 131072)):
        chain = ChainStep(shape, [context - 37 * i for i in range(bsz)])
        times = {n: [] for n in names}
        ref = None
        for _ in range(3):
            for n in names:
                scoring.score_pages_gluon, scoring.score_pages_gluon_heads = versions[n]
                times[n].append(graph_ms(chain.run, 40))
                if ref is None:
                    ref = chain.out.clone()
                assert torch.equal(chain.out, ref), (shape, bsz, context, n)
        med = {n: sorted(t)[1] for n, t in times.items()}
        row = dict(part="attention step", shape=shape, batch=bsz, context=context, outputs_equal=True, ms=times,
                   median_ms=med, saving_us_per_layer={n: (med[names[0]] - m) * 1e3 / chain.layers for n, m in med.items()})
        print(json.dumps(row), flush=True)
        rows.append(row)
        del chain
        torch.cuda.empty_cache()
        save_rows(out_path, "python benchmarks/trials/score_copy_layout_ab.py OUT.json " + " ".join(sys.argv[2:]), rows)
    save_rows(out_path, "python benchmarks/trials/score_copy_layout_ab.py OUT.json " + " ".join(sys.argv[2:]), rows)


if __name__ == "__main__":
    main()
