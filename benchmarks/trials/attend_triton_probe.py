"""H200 probe: kernels/sparse_attend.py (pages split over programs, then a merge launch) against the shipped
SparseDecodeWrapper (FlashInfer's batch decode, ~12 us per layer at Llama-3.1-8B bs=1, budget 2048).

Same rows, entries and caches for both (probe_inputs.random_selection: budget 2048 = 128 random sealed pages and
a 9-token tail per row); each variant's output is checked against the shipped one, then timed as CUDA-graph
medians of INNER launches over distinct caches (so that the selected pages come from HBM, not L2).
results/attend_triton_probe_s16.json is this script's run (num_warps 4 and 8 then; 4 was kept);
attend_triton_lastmerge_probe_s16.json that of a form merging in each row's last program (not kept).

    OUT=DIR python benchmarks/trials/attend_triton_probe.py
"""
import json, os, sys
import torch
sys.path.insert(0, "benchmarks")
sys.path.insert(0, "benchmarks/trials")
from attention_decode import graph_ms
from probe_inputs import attend_inputs
from sglang_locks.kernels.sparse_attend import SparseAttendBuffers, attend_launch, sparse_attend_triton

OUT = os.environ.get("OUT", "/tmp")


def probe_case(shape: str, hkv: int, hq: int, bsz: int, inner: int) -> dict:
    q, views, w, n = attend_inputs(hkv, hq, bsz, inner)
    d = 128
    rows = bsz * hkv
    ref = w.run(q, *views[0]).float()
    moved = n * 16 * d * 2 * 2  # K and V of every entry
    shipped_us = graph_ms(lambda: [w.run(q, kk, vv) for kk, vv in views], 30) * 1e3 / inner
    auto = attend_launch(rows, n // rows, torch.cuda.get_device_properties(0).multi_processor_count)[0]
    row = dict(shape=shape, batch=bsz, rows=rows, pages_per_row=n // rows, mbytes=round(moved / 1e6, 2),
               shipped_us=round(shipped_us, 2), auto_splits=auto, variants=[])
    group = hq // hkv
    for splits in sorted({max(1, auto // 2), auto, min(64, auto * 2)}):
        bufs = SparseAttendBuffers(rows, group, d, splits, "cuda")
        out = torch.empty_like(q)
        for ppi in (2, 4, 8):
            def run(kk, vv):
                return sparse_attend_triton(q, kk, vv, w.indptr, w.indices, w.last_page_len, rows, splits, d ** -0.5,
                                            bufs, out, pages_per_iter=ppi)
            got = run(*views[0]).float()
            us = graph_ms(lambda: [run(kk, vv) for kk, vv in views], 30) * 1e3 / inner
            row["variants"].append(dict(splits=splits, pages_per_iter=ppi, us=round(us, 2),
                                        gbs=round(moved / us / 1e3, 1), max_diff=round((got - ref).abs().max().item(), 4)))
    best = min(row["variants"], key=lambda r: r["us"])
    row["best"] = best
    row["best_vs_shipped"] = round(shipped_us / best["us"], 2)
    return row


rows = []
for case in (("llama", 8, 32, 1, 20), ("glm", 2, 32, 1, 20), ("llama", 8, 32, 4, 12), ("llama", 8, 32, 8, 6)):
    rows.append(probe_case(*case))
    r = rows[-1]
    print({k: r[k] for k in r if k != "variants"}, flush=True)
    json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, open(os.path.join(OUT, "attend_triton_probe.json"), "w"),
              indent=1)
    torch.cuda.empty_cache()
