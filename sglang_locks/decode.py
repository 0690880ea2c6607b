"""LocksDecode: score, select and attend for one decode step of one layer."""

from __future__ import annotations

import torch

from .config import LocksConfig
from .kernels.page_selection import (CacheWrite, PageScores, SelectionState, selected_indices_torch,
                                       selected_indices_triton)
from .scoring import candidate_buffer, locks_aggregate_torch, locks_scores_triton, prefiltered, score_pages_shared
from .selection import select_pages, selected_pages
from .shared_prefix import SharedRuns
from .sparse_decode import SparseDecodeWrapper, sparse_decode_reference
from .summaries import PageSummaries


class LocksDecode:
    """The LOCKS decode path, shaped like a FlashInfer wrapper: plan per step, run per layer.

    run() launches only device work on static buffers, so a decode step of all
    layers can be captured in one CUDA graph after plan().
    """

    def __init__(
        self,
        config: LocksConfig,
        workspace: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        max_batch_size: int,
        use_cuda_graph: bool = False,
        candidates: torch.Tensor = None,
        selection_state: SelectionState = None,
    ) -> None:
        """candidates: the prefilter's candidate_buffer of >= max_batch_size * H_kv rows, and selection_state: a
        SelectionState of >= max_batch_size * H_kv rows and >= num_qo_heads / H_kv query heads a row; decoders
        running one after the other may share both (each launch leaves the state zeroed; allocated when None)."""
        self.config = config
        max_indices = max_batch_size * num_kv_heads * (config.budget_pages + 1)
        self.sparse = SparseDecodeWrapper(
            workspace, num_qo_heads, num_kv_heads, head_dim, max_batch_size, max_indices, use_cuda_graph,
            config.sparse_decode,
        )
        self.sm_scale = head_dim**-0.5
        self.max_pages = 0
        self.num_kv_heads = num_kv_heads
        rows, group = max_batch_size * num_kv_heads, num_qo_heads // num_kv_heads
        if selection_state is None:
            selection_state = SelectionState(rows, workspace.device, group)
        elif selection_state.rows < rows or selection_state.max_group < group:
            raise ValueError(f"selection_state holds {selection_state.rows} rows of {selection_state.max_group} query "
                             f"heads, fewer than this decoder's {rows} of {group}")
        self.selection_state = selection_state
        # The prefilter's candidate pages of each row (scoring.locks_scores_triton).
        if candidates is None:
            candidates = candidate_buffer(max_batch_size * num_kv_heads, config, workspace.device)
        self.candidates = candidates
        self.shared_runs = None

    def share_runs(self, runs: SharedRuns = None) -> None:
        """Score each group's shared run once for all its members (runs: shared_prefix.shared_runs of the batch,
        device tensors the steps read; None: each request's pages on their own). Not with the prefilter."""
        self.shared_runs = runs

    def plan(self, seq_lens_cpu: torch.Tensor, q_dtype, kv_dtype, sm_scale: float = None, max_pages: int = None) -> None:
        """max_pages: width of the score buffers (static under CUDA graphs); default the longest request's."""
        if sm_scale is not None:
            self.sm_scale = sm_scale
        self.max_pages = max_pages or max(1, int(seq_lens_cpu.max()) // self.config.page_size)
        self.sparse.plan(seq_lens_cpu, self.config.budget_pages, q_dtype, kv_dtype, self.sm_scale)

    def select(self, q, summaries: PageSummaries, req_to_token, req_pool_indices, seq_lens,
               cache_write: CacheWrite = None) -> None:
        """Score, then select the pages each row attends (and, with cache_write, write the step's keys and values
        into the caches, which the sparse decode reads next)."""
        cfg = self.config
        if self.shared_runs is not None and not prefiltered(cfg, self.max_pages):
            scored = PageScores(*score_pages_shared(q, summaries, req_to_token, req_pool_indices, seq_lens,
                                                    self.max_pages, self.sm_scale, self.shared_runs))
        else:
            scored = locks_scores_triton(q, summaries, req_to_token, req_pool_indices, seq_lens, self.max_pages,
                                         self.sm_scale, cfg, self.selection_state, self.candidates)
        sparse = self.sparse
        selected_indices_triton(scored, req_to_token, req_pool_indices, seq_lens, sparse.indptr, sparse.indices,
                                sparse.last_page_len, self.num_kv_heads, cfg.sink_pages, cfg.local_pages,
                                cfg.gqa_aggregation, cfg.budget_pages, self.selection_state, cache_write)

    def run(self, q, k_cache, v_cache, summaries: PageSummaries, req_to_token, req_pool_indices, seq_lens,
            new_kv=None, k_scale: float = None, v_scale: float = None):
        """q [B, Hq, d]; k_cache/v_cache [slots, H_kv, d] -> [B, Hq, d]. new_kv: (k, v [B, H_kv, d], slots [B]), the
        step's keys and values, written into the caches before the sparse decode reads them (CacheWrite; caches
        of q's dtype). k_scale, v_scale: an fp8 cache's (SparseDecodeWrapper.run); the summaries were built from
        the dequantised keys, so scoring needs neither."""
        write = None if new_kv is None else CacheWrite(new_kv[0], new_kv[1], k_cache, v_cache, new_kv[2])
        self.select(q, summaries, req_to_token, req_pool_indices, seq_lens, write)
        return self.sparse.run(q, k_cache, v_cache, k_scale=k_scale, v_scale=v_scale)


def locks_decode_reference(q, k_cache, v_cache, summaries, req_to_token, req_pool_indices, seq_lens, config: LocksConfig,
                           sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0):
    """Torch reference of LocksDecode.run (scores in the dtype of q, attention in float32)."""
    hkv = summaries.num_kv_heads
    max_pages = max(1, int(seq_lens.max()) // config.page_size)
    agg = locks_aggregate_torch(q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, sm_scale, config)
    sel = select_pages(agg, config.budget_pages)
    indptr, indices = selected_indices_torch(sel, req_to_token, req_pool_indices, seq_lens, hkv, config.budget_pages)
    _, last_page_len = selected_pages(seq_lens, hkv, config.budget_pages)
    return sparse_decode_reference(q, k_cache, v_cache, indptr, indices, last_page_len, hkv, sm_scale, k_scale,
                                   v_scale)
