"""FlashInfer sparse decode (LOCKS's attend) by split setting: auto (current), fixed_split_size in pages,
CUDA-core decode; 20 launches per graph over distinct caches (HBM, not L2); outputs checked against auto.
OUT=DIR python benchmarks/trials/attend_split_probe.py"""
import functools, json, os, sys, traceback
import torch
import flashinfer
sys.path.insert(0, "benchmarks")
sys.path.insert(0, "benchmarks/trials")
from attention_decode import graph_ms
from probe_inputs import random_selection
from sglang_locks import sparse_decode as sd

OUT = os.environ.get("OUT", "/tmp")
INNER = 20
rows = []
orig = flashinfer.BatchDecodeWithPagedKVCacheWrapper
VARIANTS = [("auto", {}, {})] + [(f"split{s}", {}, {"fixed_split_size": s}) for s in (2, 4, 8, 16, 32, 64, 129)] + \
           [("cuda_core", {"use_tensor_cores": False}, {}), ("nopdl", {}, {}), ("auto_again", {}, {})]
for shape, hkv, hq, bsz in (("llama", 8, 32, 1), ("glm", 2, 32, 1), ("llama", 8, 32, 4)):
    ctx = 131072 + 9
    slots = bsz * ctx + 64
    k = torch.randn(INNER * slots, hkv, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(bsz, hq, 128, device="cuda", dtype=torch.bfloat16)
    ref = None
    for name, ctor_kw, plan_kw in VARIANTS:
        if name == "cuda_core" and hq // hkv > 8:
            continue
        try:
            def make(*a, **k2):
                w = orig(*a, **{**k2, **ctor_kw})
                if plan_kw:
                    w.plan = functools.partial(w.plan, **plan_kw)
                return w
            flashinfer.BatchDecodeWithPagedKVCacheWrapper = make
            ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
            w = sd.SparseDecodeWrapper(ws, hq, hkv, 128, bsz, bsz * hkv * 130, use_cuda_graph=True, kernel="flashinfer")
            lens = torch.full((bsz,), ctx, dtype=torch.int32)
            w.plan(lens, 128, torch.bfloat16, torch.bfloat16, 128 ** -0.5)
            if name == "nopdl":
                w.wrapper.run = functools.partial(w.wrapper.run, enable_pdl=False)
            n = random_selection(w, bsz, hkv, ctx)
            views = [(k[i * slots:(i + 1) * slots], v[i * slots:(i + 1) * slots]) for i in range(INNER)]
            o = w.run(q, *views[0]).float()
            if ref is None:
                ref = o
            def many():
                for kk, vv in views:
                    w.run(q, kk, vv)
            us = graph_ms(many, 30) * 1e3 / INNER
            rows.append(dict(shape=shape, batch=bsz, variant=name, us=round(us, 2), entries=n,
                             max_diff_vs_auto=(o - ref).abs().max().item()))
        except Exception:
            rows.append(dict(shape=shape, batch=bsz, variant=name, error=traceback.format_exc()[-600:]))
        finally:
            flashinfer.BatchDecodeWithPagedKVCacheWrapper = orig
        print(rows[-1], flush=True)
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, open(os.path.join(OUT, "attend_split_probe.json"), "w"), indent=1)
    del k, v
    torch.cuda.empty_cache()
