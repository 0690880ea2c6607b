"""One launch of the Gluon score kernel the launcher picks (scoring.score_pages_full: score_pages_gluon_heads at 16
query heads per KV head, score_pages_gluon otherwise) to profile, after 2 warm-up launches, at one layer of SHAPE,
bs=1:

    ncu --clock-control none --set full --import-source yes -k regex:_score_pages --launch-skip 2 \\
        --launch-count 1 -o rep python3 research/ncu_score_gluon.py glm4-9b-1m
    ncu --import rep.ncu-rep --page details
    ncu --import rep.ncu-rep --page source --csv --print-source sass | python3 research/ncu_stalls.py
"""
import sys
import torch
sys.path.insert(0, "benchmarks")
from attention_decode import one_layer_inputs
from sglang_locks.scoring import score_pages_full
args, _ = one_layer_inputs(sys.argv[1])
for _ in range(3):
    score_pages_full(*args, kernel="gluon")
torch.cuda.synchronize()
