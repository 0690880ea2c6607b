"""H200 A/B: this tree's Gluon score kernels against other versions of them, alternated in one process, distinct
summaries per launch, 20 launches per graph.

    git show REV:kernels/score_pages_gluon.py > DIR/score_pages_gluon_base.py
    python research/score_copy_ab.py OUT.json base=DIR/score_pages_gluon_base.py [NAME=FILE ...]

Each FILE is a version of kernels/score_pages_gluon.py or kernels/score_pages_gluon_heads.py (relative imports
resolve against this tree's sglang_locks.kernels); a case runs the versions that define its kernel
(score_pages_gluon_heads at 16 query heads per KV head, score_pages_gluon otherwise) beside this tree's ("head").
The first version named is the reference of the score differences reported. CASES=shape:batch:context,... runs
only those of the cases below.
BUILD_HEADS=1 gives each version of score_pages_gluon.py this tree's heads kernel built on it (for changes to what
both kernels share, such as the summary copies). CHAIN=shape:batch:context,... also times the attention step of all
layers (ChainStep, one CUDA graph) with each version's kernels swapped into sglang_locks.scoring, alternated 3 times;
savings in us a layer against the first version, and whether each version's outputs equal the first's.
(score_mu_swizzle_ab_s15.json and score_copy_ab_245011d.json came from this script's version at 245011d;
score_copy_layout_ab_s28*.json from score_copy_layout_ab.py at 28ca243, since folded in here as BUILD_HEADS and CHAIN.)"""
import json, os, sys, tempfile
import torch
sys.path.insert(0, "benchmarks")
from attention_decode import SHAPES, copy_bandwidth_gbs, graph_ms, score_launched_alone
sys.path.insert(0, "research")
from probe_inputs import ChainStep, load_kernel_version, score_inputs
from sglang_locks import scoring
from sglang_locks.kernels import score_pages_gluon, score_pages_gluon_heads


def load(name, path):
    """A version's module (sglang_locks.kernels._score_NAME); with BUILD_HEADS=1 a version of score_pages_gluon.py
    also gets this tree's heads kernel, importing from it."""
    module = load_kernel_version(f"_score_{name}", path)
    if os.environ.get("BUILD_HEADS") == "1" and not hasattr(module, "score_pages_gluon_heads"):
        src = open(score_pages_gluon_heads.__file__).read().replace("from .score_pages_gluon import",
                                                                    f"from ._score_{name} import")
        heads_path = os.path.join(tempfile.mkdtemp(), f"_score_{name}_heads.py")
        open(heads_path, "w").write(src)
        module.score_pages_gluon_heads = load_kernel_version(f"_score_{name}_heads", heads_path).score_pages_gluon_heads
    return module


out_path = sys.argv[1]
versions = [(name, load(name, path)) for name, path in (a.split("=", 1) for a in sys.argv[2:])]
versions += [("head", score_pages_gluon), ("head", score_pages_gluon_heads)]
rows = []


def save():
    json.dump({"gpu": torch.cuda.get_device_name(), "git": os.environ.get("GIT_REV"), "date": os.environ.get("DATE"),
               "command": "python " + " ".join(sys.argv), "copy_gbs": copy, "rows": rows},
              open(out_path, "w"), indent=1)


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
    save()
    del sums
    torch.cuda.empty_cache()

# The attention step: each version's (score_pages_gluon, score_pages_gluon_heads), the tree's where it has none.
kernels = {}
for name, m in versions:
    gluon_fn, heads_fn = kernels.get(name, (score_pages_gluon.score_pages_gluon,
                                            score_pages_gluon_heads.score_pages_gluon_heads))
    kernels[name] = (getattr(m, "score_pages_gluon", gluon_fn), getattr(m, "score_pages_gluon_heads", heads_fn))
first = next(iter(kernels))
for case in filter(None, os.environ.get("CHAIN", "").split(",")):
    shape, bsz, context = case.split(":")
    bsz, context = int(bsz), int(context)
    chain = ChainStep(shape, [context - 37 * i for i in range(bsz)])
    times = {n: [] for n in kernels}
    outs = {}
    for _ in range(3):
        for n, (gluon_fn, heads_fn) in kernels.items():
            scoring.score_pages_gluon, scoring.score_pages_gluon_heads = gluon_fn, heads_fn
            times[n].append(graph_ms(chain.run, 40))
            outs.setdefault(n, chain.out.clone())
    scoring.score_pages_gluon, scoring.score_pages_gluon_heads = kernels["head"]
    med = {n: sorted(t)[1] for n, t in times.items()}
    row = dict(part="attention step", shape=shape, batch=bsz, context=context, ms=times, median_ms=med,
               saving_us_per_layer={n: (med[first] - m) * 1e3 / chain.layers for n, m in med.items()},
               outputs_equal={n: torch.equal(o, outs[first]) for n, o in outs.items()})
    rows.append(row)
    print(json.dumps(row), flush=True)
    save()
    del chain
    torch.cuda.empty_cache()
