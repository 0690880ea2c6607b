"""One launch of the Gluon score kernel the launcher picks (score_pages_gluon_heads at 16 query heads per KV head,
score_pages_gluon otherwise) to profile, after 2 warm-up launches, at one layer of SHAPE, bs=1:

    ncu --clock-control none --set full --import-source yes -k regex:_score_pages --launch-skip 2 \\
        --launch-count 1 -o rep python3 benchmarks/trials/ncu_score_gluon.py glm4-9b-1m
    ncu --import rep.ncu-rep --page details
    ncu --import rep.ncu-rep --page source --csv --print-source sass | python3 benchmarks/trials/ncu_stalls.py
"""
import sys
import torch
sys.path.insert(0, "benchmarks")
from attention_decode import SHAPES, one_layer_inputs
from sglang_locks.kernels.score_pages_gluon import score_pages_gluon
from sglang_locks.kernels.score_pages_gluon_heads import score_pages_gluon_heads
_, hkv, hq, _ = SHAPES[sys.argv[1]]
kernel = score_pages_gluon_heads if hq == 16 * hkv else score_pages_gluon
args, _ = one_layer_inputs(sys.argv[1])
for _ in range(3):
    kernel(*args)
torch.cuda.synchronize()
