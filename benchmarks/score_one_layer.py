"""Run the scoring kernel on one Llama-shape 128K layer, for profilers (ncu, nsys).

    ncu -k regex:_score_pages -s 2 -c 1 --section SpeedOfLight python3 benchmarks/score_one_layer.py BLOCK_PAGES NUM_WARPS NUM_STAGES
"""

import sys

import torch

from attention_decode import random_summaries
from sglang_locks.kernels.score_pages import score_pages_triton

CONTEXT, KV_HEADS, Q_HEADS, HEAD_DIM = 131072, 8, 32, 128


def main():
    block_pages, num_warps, num_stages = (int(a) for a in sys.argv[1:4])
    summ = random_summaries(CONTEXT // 16 + 1, KV_HEADS, HEAD_DIM, 8)
    req_to_token = (torch.arange(CONTEXT, device="cuda", dtype=torch.int32) + 16).view(1, CONTEXT)
    req_pool = torch.zeros(1, device="cuda", dtype=torch.int32)
    seq_lens = torch.full((1,), CONTEXT, device="cuda", dtype=torch.int32)
    q = torch.randn(1, Q_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        score_pages_triton(q, summ, req_to_token, req_pool, seq_lens, CONTEXT // 16, HEAD_DIM**-0.5,
                           block_pages, num_warps, num_stages)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
