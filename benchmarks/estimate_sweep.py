"""Launch options of the prefilter's estimate launch (rank 2) at Llama 128K and GLM 1M, one layer, bs=1."""
import sys
sys.path.insert(0, "benchmarks")
from attention_decode import launch_us, one_layer_inputs
from sglang_locks.kernels.score_pages import score_pages_triton
for shape in ("llama3.1-8b", "glm4-9b-1m"):
    call, moved = one_layer_inputs(shape)
    for rank in (0, 2):
        for bp, warps, stages in ((32, 2, 3), (32, 4, 3), (64, 4, 2), (64, 4, 3), (64, 8, 3), (128, 4, 2), (128, 8, 2)):
            try:
                us = launch_us(lambda: score_pages_triton(*call, terms="estimate", estimate_rank=rank, block_pages=bp,
                                                          num_warps=warps, num_stages=stages))
                print(shape, "rank", rank, "block", bp, "warps", warps, "stages", stages, f"{us:.1f} us", flush=True)
            except Exception as e:
                print(shape, rank, bp, warps, stages, "error", str(e)[:100], flush=True)
