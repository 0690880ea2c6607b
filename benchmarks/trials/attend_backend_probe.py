"""LOCKS's sparse decode (SparseDecodeWrapper) by FlashInfer backend: fa2 (what "auto" picks for bf16) vs fa3
(the sm90 kernels), one layer of 128 selected pages + the tail per (request, KV head), CUDA-graph medians of
20 launches; outputs compared with fa2's.

    OUT=DIR python benchmarks/trials/attend_backend_probe.py   (from the repository root)
"""
import json, os, sys, traceback
import torch
import flashinfer
sys.path.insert(0, "benchmarks")
sys.path.insert(0, "benchmarks/trials")
from attention_decode import launch_us
from probe_inputs import random_selection
from sglang_locks import sparse_decode as sd

OUT = os.environ.get("OUT", "/tmp")
rows = []
orig = flashinfer.BatchDecodeWithPagedKVCacheWrapper
for shape, hkv, hq, bsz in (("llama", 8, 32, 1), ("llama", 8, 32, 4), ("glm", 2, 32, 1)):
    ctx = 131072 + 9
    slots = bsz * ctx + 64
    k = torch.randn(slots, hkv, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(bsz, hq, 128, device="cuda", dtype=torch.bfloat16)
    outs = {}
    for name, kw in (("fa2", {}), ("fa3", {"backend": "fa3"}), ("fa2_again", {})):
        try:
            flashinfer.BatchDecodeWithPagedKVCacheWrapper = lambda *a, **k2: orig(*a, **{**k2, **kw})
            ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
            w = sd.SparseDecodeWrapper(ws, hq, hkv, 128, bsz, bsz * hkv * 130, use_cuda_graph=True, kernel="flashinfer")
            lens = torch.full((bsz,), ctx, dtype=torch.int32)
            w.plan(lens, 128, torch.bfloat16, torch.bfloat16, 128 ** -0.5)
            n = random_selection(w, bsz, hkv, ctx)
            o = w.run(q, k, v)
            outs[name] = o.float()
            us = launch_us(lambda: w.run(q, k, v))
            rows.append(dict(shape=shape, batch=bsz, backend=name, us=us, entries=n,
                             max_diff_vs_fa2=(o.float() - outs["fa2"]).abs().max().item()))
        except Exception:
            rows.append(dict(shape=shape, batch=bsz, backend=name, error=traceback.format_exc()[-800:]))
        finally:
            flashinfer.BatchDecodeWithPagedKVCacheWrapper = orig
        print(rows[-1], flush=True)
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, open(os.path.join(OUT, "attend_backend_probe.json"), "w"), indent=1)
