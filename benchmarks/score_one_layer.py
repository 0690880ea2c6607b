"""Run the scoring kernel on one layer (Llama-3.1-8B shape at 128K or GLM-4-9B-1M at 1M), for profilers.

    ncu --clock-control none --set full -k regex:_score_pages -c 1 python3 score_one_layer.py SHAPE INT_CONVERSION BLOCK_PAGES NUM_WARPS

SHAPE: llama3.1-8b or glm4-9b-1m (run from benchmarks/). Random int8-int4-int8
summaries, as in score_sweep.py; three launches.
"""

import sys

import torch

from attention_decode import SHAPES, random_summaries
from sglang_locks.kernels.score_pages import score_pages_triton

CONTEXTS = {"llama3.1-8b": 131072, "glm4-9b-1m": 1048576}


def main():
    shape, conversion = sys.argv[1], sys.argv[2]
    block_pages, num_warps = int(sys.argv[3]), int(sys.argv[4])
    context = CONTEXTS[shape]
    _, kv_heads, q_heads, head_dim = SHAPES[shape]
    summ = random_summaries(context // 16 + 1, kv_heads, head_dim, 8)
    req_to_token = (torch.arange(context, device="cuda", dtype=torch.int32) + 16).view(1, context)
    req_pool = torch.zeros(1, device="cuda", dtype=torch.int32)
    seq_lens = torch.full((1,), context, device="cuda", dtype=torch.int32)
    q = torch.randn(1, q_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        score_pages_triton(q, summ, req_to_token, req_pool, seq_lens, context // 16, 0.088,
                           block_pages, num_warps, int_conversion=conversion)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
