"""Sparse decode through FlashInfer: each (request, KV head) attends its own selected tokens.

The token-major cache [slots, H_kv, d] (SGLang's layout) is viewed for free as
[slots * H_kv, 1, 1, d]: FlashInfer pages of one token and one KV head. Row
b * H_kv + h of the batch is request b's KV head h with its G query heads, and
its indices are slot * H_kv + h for the tokens that head selected.
"""

from __future__ import annotations

from typing import Optional

import torch

from .selection import selection_indptr


class SparseDecodeWrapper:
    """plan() once per decode step (host), run() per layer (device, graph-safe).

    Between them the caller writes each row's token indices into ``indices``
    at ``indptr`` (selected_indices_triton does).
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
    ) -> None:
        from flashinfer import BatchDecodeWithPagedKVCacheWrapper

        if num_qo_heads % num_kv_heads:
            raise ValueError(f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_qo_heads, self.num_kv_heads, self.head_dim = num_qo_heads, num_kv_heads, head_dim
        self.group = num_qo_heads // num_kv_heads
        device = workspace.device
        rows = max_batch_size * num_kv_heads
        self.indptr = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self.indices = torch.zeros(max_indices, dtype=torch.int32, device=device)
        self.last_page_len = torch.ones(rows, dtype=torch.int32, device=device)
        self._graph_rows = rows if use_cuda_graph else None
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

    def plan(self, seq_lens_cpu: torch.Tensor, budget_pages: int, q_dtype, kv_dtype, sm_scale: float) -> None:
        indptr = selection_indptr(seq_lens_cpu.cpu(), self.num_kv_heads, budget_pages)
        rows = indptr.numel() - 1
        if self._graph_rows is not None and rows != self._graph_rows:
            raise ValueError(f"a CUDA-graph wrapper serves exactly {self._graph_rows // self.num_kv_heads} requests")
        total = int(indptr[-1])
        if total > self.indices.numel():
            raise ValueError(f"{total} selected tokens exceed max_indices={self.indices.numel()}")
        self.rows = rows
        self.indptr[: rows + 1].copy_(indptr, non_blocking=True)
        self.wrapper.plan(
            indptr,
            self.indices[:total],
            torch.ones(rows, dtype=torch.int32),
            self.group,
            1,
            self.head_dim,
            1,
            q_data_type=q_dtype,
            kv_data_type=kv_dtype,
            sm_scale=sm_scale,
        )

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: Optional[torch.Tensor] = None):
        """q [B, Hq, d]; k_cache/v_cache [slots, H_kv, d] -> [B, Hq, d]."""
        bsz = q.shape[0]
        d = self.head_dim
        kv = (k_cache.view(-1, 1, 1, d), v_cache.view(-1, 1, 1, d))
        o = self.wrapper.run(q.reshape(bsz * self.num_kv_heads, self.group, d), kv,
                             out=None if out is None else out.view(bsz * self.num_kv_heads, self.group, d))
        return o.view(bsz, self.num_qo_heads, d)


def sparse_decode_reference(q, k_cache, v_cache, indptr, indices, num_kv_heads: int, sm_scale: float):
    """Float32 reference of SparseDecodeWrapper.run on the same indptr/indices."""
    bsz, hq, d = q.shape
    group = hq // num_kv_heads
    k_flat = k_cache.reshape(-1, d).float()
    v_flat = v_cache.reshape(-1, d).float()
    out = torch.empty(bsz, hq, d, dtype=torch.float32, device=q.device)
    indptr = indptr.cpu()
    for row in range(bsz * num_kv_heads):
        b, h = divmod(row, num_kv_heads)
        idx = indices[int(indptr[row]) : int(indptr[row + 1])].long().to(q.device)
        qg = q[b, h * group : (h + 1) * group].float()
        p = torch.softmax(qg @ k_flat[idx].T * sm_scale, -1)
        out[b, h * group : (h + 1) * group] = p @ v_flat[idx]
    return out


def dense_decode_reference(q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, sm_scale: float):
    """Float32 dense attention of each request's whole context (GQA)."""
    bsz, hq, d = q.shape
    hkv = k_cache.shape[1]
    out = torch.empty(bsz, hq, d, dtype=torch.float32, device=q.device)
    for b in range(bsz):
        slots = req_to_token[int(req_pool_indices[b]), : int(seq_lens[b])].long()
        k = k_cache[slots].float().repeat_interleave(hq // hkv, 1)  # [n, Hq, d]
        v = v_cache[slots].float().repeat_interleave(hq // hkv, 1)
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[b].float(), k) * sm_scale, -1)
        out[b] = torch.einsum("hn,nhd->hd", p, v)
    return out
