"""H200 probe, not yet run: LOCKS's sparse decode through FlashInfer's XQA decode kernel
(flashinfer.decode.xqa_batch_decode_with_kv_cache, TensorRT-LLM's low-latency GQA decode) against the shipped
SparseDecodeWrapper (FlashInfer's batch decode, fa2 tensor cores: ~12 us per layer at Llama-3.1-8B bs=1, budget
2048, whatever the bytes; results/attend_split_probe_s15.json).

Same rows as the shipped path: row (request, KV head) with its G query heads and one KV head, its pages the
per-head view of the token-major cache (sparse_decode.per_head_pages: page stride d, token stride H_kv * d; XQA
takes the strides), its page list a row of block_tables (the rows of a step hold equally many pages: budget +
tail), its length in tokens as seq_lens. Checks the output against the shipped wrapper's, then times both
(20 launches over distinct caches per CUDA graph). XQA is compiled on first use (nvcc; the first call's seconds
are reported): save it with `bash .gpu-kit/save-jit-cache.sh $OUT/jit-cache-xqa.tar.xz`.

    OUT=DIR python benchmarks/trials/attend_xqa_probe.py
"""
import json, os, sys, time, traceback
import torch
sys.path.insert(0, "benchmarks")
sys.path.insert(0, "benchmarks/trials")
from attention_decode import graph_ms
from probe_inputs import attend_inputs
from flashinfer.decode import xqa_batch_decode_with_kv_cache
from sglang_locks import sparse_decode as sd

OUT = os.environ.get("OUT", "/tmp")
INNER = 20


def probe_case(shape: str, hkv: int, hq: int, bsz: int) -> dict:
    q, views, w, n = attend_inputs(hkv, hq, bsz, INNER)
    d = 128
    n_rows = bsz * hkv
    pages_per_row = n // n_rows
    group = hq // hkv
    ref = w.run(q, *views[0]).float()
    shipped_us = graph_ms(lambda: [w.run(q, kk, vv) for kk, vv in views], 30) * 1e3 / INNER
    row = dict(shape=shape, batch=bsz, rows=n_rows, pages_per_row=pages_per_row, shipped_us=round(shipped_us, 2))
    try:
        block_tables = w.indices[:n].view(n_rows, pages_per_row)
        seq_lens = ((pages_per_row - 1) * 16 + w.last_page_len[:n_rows]).to(torch.int32)  # read as uint32
        xws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")   # semaphores must start at zero
        out = torch.empty(n_rows, group, d, device="cuda", dtype=torch.bfloat16)

        def xqa(kk, vv):
            return xqa_batch_decode_with_kv_cache(
                q.view(n_rows, group, d), (sd.per_head_pages(kk), sd.per_head_pages(vv)), xws, block_tables,
                seq_lens, pages_per_row * 16, bmm1_scale=d ** -0.5, bmm2_scale=1.0, out=out, kv_layout="NHD")

        t0 = time.time()
        got = xqa(*views[0]).float().view(bsz, hq, d)
        torch.cuda.synchronize()
        row["xqa_first_call_s"] = round(time.time() - t0, 1)
        row["xqa_max_diff_vs_shipped"] = (got - ref).abs().max().item()
        row["xqa_us"] = round(graph_ms(lambda: [xqa(kk, vv) for kk, vv in views], 30) * 1e3 / INNER, 2)
    except Exception:
        row["xqa_error"] = traceback.format_exc()[-1200:]
    return row


rows = []
for case in (("llama", 8, 32, 1), ("glm", 2, 32, 1), ("llama", 8, 32, 4)):
    rows.append(probe_case(*case))
    print(rows[-1], flush=True)
    json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, open(os.path.join(OUT, "attend_xqa_probe.json"), "w"),
              indent=1)
    torch.cuda.empty_cache()
