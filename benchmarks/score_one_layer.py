"""Run the scoring kernel on one layer (Llama-3.1-8B shape at 128K or GLM-4-9B-1M at 1M), for profilers.

    ncu --clock-control none --set full -k regex:_score_pages -c 1 python3 score_one_layer.py SHAPE INT_CONVERSION BLOCK_PAGES NUM_WARPS

SHAPE: llama3.1-8b or glm4-9b-1m (run from benchmarks/). Random int8-int4-int8
summaries, as in score_sweep.py; three launches.
"""

import sys

import torch

from attention_decode import one_layer_inputs
from sglang_locks.kernels.score_pages import score_pages_triton


def main():
    shape, conversion = sys.argv[1], sys.argv[2]
    block_pages, num_warps = int(sys.argv[3]), int(sys.argv[4])
    call, _ = one_layer_inputs(shape)
    for _ in range(3):
        score_pages_triton(*call, block_pages, num_warps, int_conversion=conversion)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
