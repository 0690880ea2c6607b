"""One selection launch to profile (after 2 warm-up launches) at one layer of SHAPE and CONTEXT, bs=1:

    ncu --clock-control none --set full -k regex:_select_kernel --launch-skip 2 --launch-count 1 -o rep \\
        python3 research/ncu_select.py glm4-9b-1m 131072
    ncu --import rep.ncu-rep --page details
"""
import sys
import torch
sys.path.insert(0, "benchmarks")
from attention_decode import one_layer_inputs
from sglang_locks.config import LocksConfig
from sglang_locks.kernels.page_selection import PageScores, SelectionState, selected_indices_triton
from sglang_locks.scoring import score_pages_full
from sglang_locks.selection import selected_pages

args, _ = one_layer_inputs(sys.argv[1], int(sys.argv[2]))
q, summaries, req_to_token, req_pool, seq_lens, max_pages, sm_scale = args
hkv = summaries.num_kv_heads
cfg = LocksConfig()
scored = score_pages_full(*args)
indptr, last = selected_pages(seq_lens.cpu(), hkv, cfg.budget_pages)
indptr = indptr.cuda()
indices = torch.empty(int(indptr[-1]), dtype=torch.int32, device="cuda")
last_len = torch.empty(hkv, dtype=torch.int32, device="cuda")
state = SelectionState(hkv, q.device)
for _ in range(3):
    selected_indices_triton(PageScores(*scored), req_to_token, req_pool, seq_lens, indptr, indices, last_len, hkv,
                            cfg.sink_pages, cfg.local_pages, cfg.gqa_aggregation, cfg.budget_pages, state)
torch.cuda.synchronize()
