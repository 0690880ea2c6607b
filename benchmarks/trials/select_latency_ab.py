"""H200: the selection launch of this tree against a base revision's, alternated on the same scores, outputs compared.

    git show REV:kernels/aggregate_scores.py > DIR/aggregate_scores.py
    git show REV:kernels/selected_indices.py | sed 's/from \\.aggregate_scores import/from ._agg_base import/' > DIR/selected_indices.py
    python benchmarks/trials/select_latency_ab.py OUT.json DIR [VARIANT_DIR ...]

One layer's launch, 20 per CUDA graph, median of 30 replays, three alternations per case; scores from the
shipped score kernel on random summaries (benchmarks/attention_decode.random_summaries)."""
import json, os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from attention_decode import SHAPES, launch_us, random_summaries
from sglang_locks.config import LocksConfig
from sglang_locks.scoring import score_pages_full
from sglang_locks.selection import selected_pages
import sglang_locks.kernels.selected_indices as head
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
from probe_inputs import load_kernel_version


class OnePhase:
    """The selection kernel launched for one phase alone, without its row barrier."""

    def __init__(self, kernel, phase):
        self.kernel, self.phase = kernel, phase

    def __getitem__(self, grid):
        return lambda *args, PHASE, SYNC, **consts: self.kernel[grid](*args, PHASE=self.phase, SYNC=False, **consts)


kernel = head._select_kernel
out_path, base_dir = sys.argv[1], sys.argv[2]
load_kernel_version("_agg_base", os.path.join(base_dir, "aggregate_scores.py"))
base = load_kernel_version("_sel_base", os.path.join(base_dir, "selected_indices.py"))
# further versions to time beside them: directories with a selected_indices.py (importing this tree's modules)
versions = [("base", base), ("head", head)] + [(os.path.basename(d.rstrip("/")), load_kernel_version(f"_sel_{i}", os.path.join(d, "selected_indices.py")))
                                                for i, d in enumerate(sys.argv[3:])]
cfg = LocksConfig()
rows = []
# (shape, batch, context[, width]): width, the tokens the score buffers span (under CUDA graphs, the longest
# context a graph serves), defaults to the context
CASES = (("llama3.1-8b", 1, 131072), ("llama3.1-8b", 1, 262144), ("llama3.1-8b", 1, 1048576), ("llama3.1-8b", 4, 131072),
         ("llama3.1-8b", 8, 131072), ("llama3.1-8b", 8, 1048576), ("glm4-9b-1m", 1, 131072), ("glm4-9b-1m", 1, 262144),
         ("glm4-9b-1m", 1, 1048576), ("glm4-9b-1m", 8, 262144), ("llama3.1-8b", 1, 131072, 1048576),
         ("llama3.1-8b", 1, 262144, 1048576), ("llama3.1-8b", 4, 131072, 1048576), ("llama3.1-8b", 1, 32768, 1048576),
         ("glm4-9b-1m", 1, 131072, 1048576))
for shape, bsz, context, *width in CASES:
    width = width[0] if width else context
    _, hkv, hq, d = SHAPES[shape]
    sums = random_summaries(bsz * context // 16 + 2, hkv, d, cfg.rank)
    # requests of different lengths (the first the longest), their pages interleaved
    lens_cpu = torch.tensor([context - 37 * i for i in range(bsz)], dtype=torch.int32)
    slots = torch.arange(bsz * context, device="cuda", dtype=torch.int32).view(context // 16, bsz, 16)
    req_to_token = (slots.transpose(0, 1).reshape(bsz, context) + 16).contiguous()
    tables = (req_to_token, torch.arange(bsz, device="cuda", dtype=torch.int32), lens_cpu.cuda())
    q = torch.randn(bsz, hq, d, device="cuda", dtype=torch.bfloat16)
    max_pages = width // 16
    scored = score_pages_full(q, sums, *tables, max_pages, d ** -0.5)
    indptr, last = selected_pages(lens_cpu, hkv, cfg.budget_pages)
    indptr = indptr.cuda()
    got = {}
    for rep in range(3):
        for name, m in versions:
            indices = torch.full((int(indptr[-1]),), -1, dtype=torch.int32, device="cuda")
            last_len = torch.zeros(bsz * hkv, dtype=torch.int32, device="cuda")
            state = m.SelectionState(bsz * hkv, q.device)
            fn = lambda: m.selected_indices_triton(*scored, *tables, indptr, indices, last_len, hkv, cfg.sink_pages,
                                                   cfg.local_pages, cfg.gqa_aggregation, cfg.budget_pages, state)
            fn()
            torch.cuda.synchronize()
            got[name] = (indices.clone(), last_len.clone())
            us = launch_us(fn)
            rows.append(dict(shape=shape, batch=bsz, context=context, width=width, version=name, rep=rep,
                             us=round(us, 2),
                             state_clear=bool(not state.hist.any() and not state.arrived.any())))
            print(rows[-1], flush=True)
    # this tree's phases as launches of their own (no barrier): where its time goes
    state = head.SelectionState(bsz * hkv, q.device)
    fn = lambda: head.selected_indices_triton(*scored, *tables, indptr, indices, last_len, hkv, cfg.sink_pages,  # noqa: E731
                                              cfg.local_pages, cfg.gqa_aggregation, cfg.budget_pages, state)
    # phase 1 (where the partials are merged in slices) and 2 make the histogram; phase 3 reads phase 2's first
    # launch's (its others add to it)
    split = head.split_merge(scored[1].shape[-1], head.selection_parts(bsz * hkv, max_pages, q.device, hq // hkv), hq // hkv)
    for phase in (1, 2, 3) if split else (2, 3):
        head._select_kernel = OnePhase(kernel, phase)
        if phase == 2:
            fn()
            hist = state.hist.clone()
        if phase == 3:
            state.hist.copy_(hist)
        rows.append(dict(shape=shape, batch=bsz, context=context, width=width, version=f"head_phase{phase}",
                         us=round(launch_us(fn), 2)))
        head._select_kernel = kernel
        print(rows[-1], flush=True)
    rows.append(dict(shape=shape, batch=bsz, context=context, width=width,
                     outputs_equal=all(all(torch.equal(a, b) for a, b in zip(got["base"], got[name])) for name, _ in versions)))
    print(rows[-1], flush=True)
    json.dump(dict(gpu=torch.cuda.get_device_name(), git=os.environ.get("GIT_REV"), date=os.environ.get("DATE"),
                   command="python " + " ".join(sys.argv), rows=rows), open(out_path, "w"), indent=1)
    sums = scored = None
    torch.cuda.empty_cache()
