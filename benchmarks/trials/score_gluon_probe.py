"""H200 probe of the Gluon score kernel (kernels/score_pages_gluon.py): float64 reference checks on mixed lengths
and shuffled tables (GQA groups 1-16), then one layer bs=1 (Llama-3.1-8B 128K, GLM-4-9B-1M 1M; sequential and
shuffled page tables) against score_pages_triton, launch variants (pairs per step, warps, stages, chunk pages).
CUDA-graph medians of 20 launches.

    OUT=DIR python benchmarks/trials/score_gluon_probe.py   (from the repository root; writes DIR/score_gluon_probe.json)
"""
import json, os, sys, traceback
import torch
sys.path.insert(0, "benchmarks")
from attention_decode import copy_bandwidth_gbs, launch_us, one_layer_inputs, random_summaries, score_launched_alone
from sglang_locks.kernels.score_pages import score_pages_triton, score_pages_torch
from sglang_locks.kernels import score_pages_gluon as gluon_kernel
OUT = os.environ.get("OUT", "/tmp")
out = {"checks": [], "rows": []}
def save():
    json.dump(out, open(os.path.join(OUT, "score_gluon_probe.json"), "w"), indent=1)
torch.manual_seed(0)
CFGS = [dict(pairs=4, num_warps=1, stages=2), dict(pairs=4, num_warps=2, stages=2), dict(pairs=2, num_warps=2, stages=3), dict(pairs=4, num_warps=1, stages=3)]
for hkv, hq in ((8, 32), (2, 32), (4, 4), (1, 8), (4, 8), (8, 16)):
    for cfg in CFGS[:2] if hq // hkv != 4 else CFGS:
        try:
            lens = [16 * 37 + 5, 33, 7, 16 * 301, 16 * 8]
            ctx = max(lens) + 64
            n_pages = sum(l // 16 + 2 for l in lens) + 8
            s = random_summaries(n_pages, hkv, 128, 8)
            rt = torch.zeros(len(lens) + 1, ctx, dtype=torch.int32, device="cuda")
            pages = torch.randperm(n_pages - 1, device="cuda") + 1
            off = 0
            for i, l in enumerate(lens):
                npg = l // 16 + 1
                pg = pages[off: off + npg]; off += npg
                rt[i + 1, :l] = (pg[:, None] * 16 + torch.arange(16, device="cuda")).reshape(-1)[:l].int()
            pool = torch.arange(1, len(lens) + 1, dtype=torch.int32, device="cuda")
            sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
            q = torch.randn(len(lens), hq, 128, device="cuda", dtype=torch.bfloat16) * 2
            maxp = ctx // 16
            ref = score_pages_torch(q.double(), s, rt, pool, sl, maxp, 128 ** -0.5)
            sc, pm, ps = gluon_kernel.score_pages_gluon(q, s, rt, pool, sl, maxp, 128 ** -0.5, **cfg)
            tr = score_pages_triton(q, s, rt, pool, sl, maxp, 128 ** -0.5)[0]
            valid = torch.isfinite(ref)
            err = (sc.double() - ref).abs()[valid].max().item()
            err_t = (tr.double() - ref).abs()[valid].max().item()
            tot = torch.logsumexp(ref.masked_fill(~valid, float("-inf")), -1)
            tot_k = torch.logsumexp(pm.double() + torch.log(ps.double()), -1)
            has = (sl // 16 > 0)[:, None].expand_as(tot)
            terr = (tot_k - tot).abs()[has].max().item()
            rec = dict(hkv=hkv, hq=hq, **cfg, max_err=err, triton_err=err_t, total_err=terr)
        except Exception:
            rec = dict(hkv=hkv, hq=hq, **cfg, error=traceback.format_exc()[-1500:])
        out["checks"].append(rec); print(rec, flush=True); save()
copy = copy_bandwidth_gbs()
out["copy_gbs"] = copy
for shape in ("llama3.1-8b", "glm4-9b-1m"):
    call, moved = one_layer_inputs(shape)
    q, s, rt, pool, sl, maxp, scale = call
    n = rt.shape[1]
    perm = torch.randperm(n // 16, device="cuda").int()
    shuf = (16 + perm.repeat_interleave(16) * 16 + torch.arange(n, device="cuda", dtype=torch.int32) % 16).view(1, n)
    for tname, t in (("seq", rt), ("shuffled", shuf)):
        c = (q, s, t, pool, sl, maxp, scale)
        variants = [("triton", {}, lambda: score_pages_triton(*c))]
        extra = [dict(pairs=2, num_warps=2, stages=2), dict(pairs=4, num_warps=2, stages=3), dict(pairs=8, num_warps=1, stages=2),
                 dict(pairs=4, num_warps=1, stages=2, chunk_pages=128), dict(pairs=4, num_warps=2, stages=2, chunk_pages=128),
                 dict(pairs=2, num_warps=2, stages=2, chunk_pages=32), dict(pairs=4, num_warps=4, stages=2), dict(pairs=2, num_warps=4, stages=2)]
        for cfg in CFGS + extra:
            variants.append(("gluon", cfg, (lambda cfg=cfg: gluon_kernel.score_pages_gluon(*c, **cfg))))
        for name, cfg, fn in variants:
            try:
                with score_launched_alone():
                    us = launch_us(fn)
                out["rows"].append(dict(shape=shape, table=tname, kernel=name, **cfg, us=us, copy_fraction=moved / us / 1e3 / copy))
            except Exception:
                out["rows"].append(dict(shape=shape, table=tname, kernel=name, **cfg, error=traceback.format_exc()[-600:]))
            print(out["rows"][-1], flush=True); save()
