"""H200 A/B: this tree's Gluon score kernels against other versions of them, alternated in one process, distinct
summaries per launch, 20 launches per graph.

    git show REV:kernels/score_pages_gluon.py > DIR/score_pages_gluon_base.py
    python benchmarks/trials/score_copy_ab.py OUT.json base=DIR/score_pages_gluon_base.py [NAME=FILE ...]

Each FILE is a version of kernels/score_pages_gluon.py or kernels/score_pages_gluon_heads.py (relative imports
resolve against this tree's sglang_locks.kernels); a case runs the versions that define its kernel
(score_pages_gluon_heads at 16 query heads per KV head, score_pages_gluon otherwise) beside this tree's ("head").
The first version named is the reference of the score differences reported. CASES=shape:batch:context,... runs
only those of the cases below.
(score_mu_swizzle_ab_s15.json and score_copy_ab_245011d.json came from this script's version at 245011d.)"""
import json, os, sys
import torch
sys.path.insert(0, "benchmarks")
from attention_decode import SHAPES, copy_bandwidth_gbs, graph_ms, score_launched_alone
sys.path.insert(0, "benchmarks/trials")
from probe_inputs import load_kernel_version, score_inputs
from sglang_locks.kernels import score_pages_gluon, score_pages_gluon_heads


out_path = sys.argv[1]
versions = [(name, load_kernel_version(f"_score_{name}", path)) for name, path in (a.split("=", 1) for a in sys.argv[2:])]
versions += [("head", score_pages_gluon), ("head", score_pages_gluon_heads)]
rows = []
copy = copy_bandwidth_gbs()
CASES = os.environ.get("CASES")
for shape, bsz, context in (("llama3.1-8b", 1, 131072), ("llama3.1-8b", 1, 262144), ("llama3.1-8b", 1, 1048576),
                            ("llama3.1-8b", 8, 131072), ("glm4-9b-1m", 1, 131072), ("glm4-9b-1m", 1, 262144),
                            ("glm4-9b-1m", 1, 1048576), ("glm4-9b-1m", 8, 262144)):
    if CASES and f"{shape}:{bsz}:{context}" not in CASES.split(","):
        continue
    _, hkv, hq, d = SHAPES[shape]
    kernel = "score_pages_gluon_heads" if hq == 16 * hkv else "score_pages_gluon"
    fns = [(name, getattr(m, kernel)) for name, m in versions if hasattr(m, kernel)]
    pages = context // 16
    nset = 4 if bsz * context <= 262144 else 2
    sums, tables, q, moved = score_inputs(shape, bsz, context, nset)
    outs = [fn(q, sums[0], *tables, pages, d ** -0.5)[0] for _, fn in fns]
    finite = torch.isfinite(outs[0])
    diffs = {f"max_diff_{name}": (o - outs[0])[finite].abs().max().item() for (name, _), o in zip(fns[1:], outs[1:])}
    times = {name: [] for name, _ in fns}
    for _ in range(3):
        for name, fn in fns:
            def many(fn=fn, sums=sums, nset=nset):
                for i in range(20):
                    fn(q, sums[i % nset], *tables, pages, d ** -0.5)
            with score_launched_alone():
                times[name].append(graph_ms(many, 30) * 1e3 / 20)
    row = dict(shape=shape, batch=bsz, context=context, kernel=kernel, **diffs,
               **{f"{k}_us": round(sorted(v)[1], 2) for k, v in times.items()},
               **{f"{k}_copy_fraction": round(moved / sorted(v)[1] / 1e3 / copy, 3) for k, v in times.items()})
    rows.append(row)
    print(row, flush=True)
    json.dump({"gpu": torch.cuda.get_device_name(), "git": os.environ.get("GIT_REV"), "date": os.environ.get("DATE"),
               "command": "python " + " ".join(sys.argv), "copy_gbs": copy, "rows": rows},
              open(out_path, "w"), indent=1)
    del sums
    torch.cuda.empty_cache()
