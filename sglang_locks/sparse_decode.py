"""Sparse decode: each (request, KV head) attends its own selected pages, through the split-page Triton kernel
(kernels/sparse_attend.py, the default) or FlashInfer's batch decode.

The token-major cache [slots, H_kv, d] (SGLang's layout) is viewed for free
as FlashInfer pages of 16 tokens of one KV head (per_head_pages): entry
slot * H_kv + h is the page of head h whose first token is slot, its tokens
H_kv * d elements apart. Row b * H_kv + h of the batch is request b's KV
head h with its G query heads, and its entries are the pages that head
selected, then the request's unsealed tail page. (Pages of one token, an
index per token, measured 2-7 % slower on the H200.) Both kernels read
these rows and entries, from a cache in q's dtype or float8_e4m3fn (SGLang's
--kv-cache-dtype fp8_e4m3: pages holding K / k_scale and V / v_scale, the
layer's scales passed to run()).
"""

from __future__ import annotations

from typing import Optional

import torch

from .config import PAGE_SIZE, SPARSE_DECODE_KERNELS
from .kernels._triton import num_sms
from .kernels.sparse_attend import SparseAttendBuffers, attend_launch, sparse_attend_triton
from .selection import pages_per_request, selected_pages


def per_head_pages(cache: torch.Tensor) -> torch.Tensor:
    """[slots, H_kv, d] -> a view [entries, 16, 1, d] (NHD pages of one head); see the module doc."""
    slots, hkv, d = cache.shape
    if cache.stride() != (hkv * d, d, 1):
        raise ValueError(f"the KV cache must be a contiguous [slots, H_kv, d] tensor, got strides {cache.stride()}")
    return cache.as_strided(((slots - PAGE_SIZE + 1) * hkv, PAGE_SIZE, 1, d), (d, hkv * d, d, 1))


class SparseDecodeWrapper:
    """plan() once per decode step (host), run() per layer (device, graph-safe).

    Between them the caller writes each row's page entries into ``indices``
    at ``indptr`` and, under CUDA graphs, the length of its last page into
    ``last_page_len`` (selected_indices_triton does both: plan() skips its
    work while the pages per row stay the same).

    kernel: "triton" (sparse_attend_triton; its parts live in workspace) or
    "flashinfer" (BatchDecodeWithPagedKVCacheWrapper; workspace is its own).
    """

    def __init__(
        self,
        workspace: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        max_batch_size: int,
        max_indices: int,
        use_cuda_graph: bool = False,
        kernel: str = "triton",
    ) -> None:
        if num_qo_heads % num_kv_heads:
            raise ValueError(f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        if kernel not in SPARSE_DECODE_KERNELS:
            raise ValueError(f"kernel must be one of {SPARSE_DECODE_KERNELS}, got {kernel!r}")
        self.num_qo_heads, self.num_kv_heads, self.head_dim = num_qo_heads, num_kv_heads, head_dim
        self.group = num_qo_heads // num_kv_heads
        self.kernel = kernel
        device = workspace.device
        rows = max_batch_size * num_kv_heads
        self.indptr = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self.indices = torch.zeros(max_indices, dtype=torch.int32, device=device)
        self.last_page_len = torch.ones(rows, dtype=torch.int32, device=device)
        self._graph_rows = rows if use_cuda_graph else None
        if kernel == "triton":
            self.parts = SparseAttendBuffers.in_workspace(workspace, self.group, head_dim)
            self.launch = (1, 4)  # attend_launch's (splits, pages per iteration) of the planned rows
        else:
            from flashinfer import BatchDecodeWithPagedKVCacheWrapper

            # Tensor-core decode handles every group size (the CUDA-core one stops at 8).
            self.wrapper = BatchDecodeWithPagedKVCacheWrapper(
                workspace,
                "NHD",
                use_cuda_graph=use_cuda_graph,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.indptr if use_cuda_graph else None,
                paged_kv_indices_buffer=self.indices if use_cuda_graph else None,
                paged_kv_last_page_len_buffer=self.last_page_len if use_cuda_graph else None,
            )
        self.rows = 0
        self.sm_scale = head_dim**-0.5
        self._planned = None  # CUDA-graph mode: (pages per request, dtypes, scale) of the last full plan

    def plan(self, seq_lens_cpu: torch.Tensor, budget_pages: int, q_dtype, kv_dtype, sm_scale: float) -> None:
        lens = seq_lens_cpu.tolist()
        rows = len(lens) * self.num_kv_heads
        if self._graph_rows is not None and rows != self._graph_rows:
            raise ValueError(f"a CUDA-graph wrapper serves exactly {self._graph_rows // self.num_kv_heads} requests")
        self.rows = rows
        key = None
        if self._graph_rows is not None:
            # The work split (FlashInfer's plan: ~0.5 ms of host time per step at Llama bs=1) depends on the pages
            # per row, not on the last page's lengths, which the kernels read from last_page_len: a long request's
            # rows keep their pages (budget + tail) from step to step. The check is plain Python: the step's host
            # time adds to its latency.
            key = (pages_per_request(lens, budget_pages), q_dtype, kv_dtype, sm_scale)
            if key == self._planned:
                return
        indptr, last_page_len = selected_pages(seq_lens_cpu, self.num_kv_heads, budget_pages)
        total = int(indptr[-1])
        if total > self.indices.numel():
            raise ValueError(f"{total} selected pages exceed max_indices={self.indices.numel()}")
        if self.kernel == "triton":
            if q_dtype not in (torch.bfloat16, torch.float16) or kv_dtype not in (q_dtype, torch.float8_e4m3fn):
                raise ValueError(f"the Triton sparse decode takes bf16 or fp16 q and KV of one dtype, or a "
                                 f"torch.float8_e4m3fn KV, got {q_dtype} and {kv_dtype} (--locks-sparse-decode "
                                 f"flashinfer takes others)")
            self.indptr[: rows + 1].copy_(indptr, non_blocking=True)
            self.last_page_len[:rows].copy_(last_page_len, non_blocking=True)
            # Static under CUDA graphs: from the rows and the most pages a row can hold, not this step's.
            self.launch = attend_launch(rows, budget_pages + 1, num_sms(self.indptr.device))
            self.sm_scale = sm_scale
        else:
            if self._graph_rows is None:  # under CUDA graphs FlashInfer's plan copies into this same buffer
                self.indptr[: rows + 1].copy_(indptr, non_blocking=True)
            self.wrapper.plan(indptr, self.indices[:total], last_page_len, self.group, 1, self.head_dim, PAGE_SIZE,
                              q_data_type=q_dtype, kv_data_type=kv_dtype, sm_scale=sm_scale)
        self._planned = key

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: Optional[torch.Tensor] = None,
            k_scale: Optional[float] = None, v_scale: Optional[float] = None):
        """q [B, Hq, d]; k_cache/v_cache [slots, H_kv, d] of plan()'s kv_dtype -> [B, Hq, d]. k_scale, v_scale: the
        layer's scales of an fp8 cache (it holds K / k_scale, V / v_scale; None: 1.0), python floats as FlashInfer
        takes them (a CUDA graph keeps each layer's)."""
        bsz = q.shape[0]
        d = self.head_dim
        if self.kernel == "triton":
            splits, pages_per_iter = self.launch
            return sparse_attend_triton(q, k_cache, v_cache, self.indptr, self.indices, self.last_page_len, self.rows,
                                        splits, self.sm_scale, self.parts, out, pages_per_iter,
                                        1.0 if k_scale is None else k_scale, 1.0 if v_scale is None else v_scale)
        o = self.wrapper.run(q.reshape(bsz * self.num_kv_heads, self.group, d),
                             (per_head_pages(k_cache), per_head_pages(v_cache)), k_scale=k_scale, v_scale=v_scale,
                             out=None if out is None else out.view(bsz * self.num_kv_heads, self.group, d))
        return o.view(bsz, self.num_qo_heads, d)


def sparse_decode_reference(q, k_cache, v_cache, indptr, indices, last_page_len, num_kv_heads: int, sm_scale: float,
                            k_scale: float = 1.0, v_scale: float = 1.0):
    """Float32 reference of SparseDecodeWrapper.run on the same indptr/indices/last_page_len (the cache holding
    K / k_scale and V / v_scale)."""
    bsz, hq, d = q.shape
    group = hq // num_kv_heads
    k_flat = k_cache.reshape(-1, d).float() * k_scale
    v_flat = v_cache.reshape(-1, d).float() * v_scale
    out = torch.empty(bsz, hq, d, dtype=torch.float32, device=q.device)
    indptr, last_page_len = indptr.cpu(), last_page_len.cpu()
    for row in range(bsz * num_kv_heads):
        b, h = divmod(row, num_kv_heads)
        entries = indices[int(indptr[row]) : int(indptr[row + 1])].long().cpu()
        if (entries % num_kv_heads != h).any():
            raise ValueError(f"row {row} holds entries of another KV head than {h}")
        first = entries // num_kv_heads
        slots = (first[:, None] + torch.arange(PAGE_SIZE)).reshape(-1)
        slots = slots[: max(0, slots.numel() - PAGE_SIZE + int(last_page_len[row]))]
        idx = (slots * num_kv_heads + h).to(q.device)
        qg = q[b, h * group : (h + 1) * group].float()
        p = torch.softmax(qg @ k_flat[idx].T * sm_scale, -1)
        out[b, h * group : (h + 1) * group] = p @ v_flat[idx]
    return out


def dense_decode_reference(q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, sm_scale: float,
                           k_scale: float = 1.0, v_scale: float = 1.0):
    """Float32 dense attention of each request's whole context (GQA; the cache holding K / k_scale, V / v_scale)."""
    bsz, hq, d = q.shape
    hkv = k_cache.shape[1]
    k_cache, v_cache = k_cache.float() * k_scale, v_cache.float() * v_scale
    out = torch.empty(bsz, hq, d, dtype=torch.float32, device=q.device)
    for b in range(bsz):
        slots = req_to_token[int(req_pool_indices[b]), : int(seq_lens[b])].long()
        k = k_cache[slots].repeat_interleave(hq // hkv, 1)  # [n, Hq, d]
        v = v_cache[slots].repeat_interleave(hq // hkv, 1)
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[b].float(), k) * sm_scale, -1)
        out[b] = torch.einsum("hn,nhd->hd", p, v)
    return out
