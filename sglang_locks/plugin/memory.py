"""LOCKS's memory in SGLang's KV budget, so that the KV pool shrinks to make room: the page summaries, added to
the per-token cell size, and the decoder's fixed buffers, taken from the bytes the pool is sized from."""

from __future__ import annotations

import dataclasses
import logging
from typing import Sequence, Tuple

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..config import PAGE_SIZE, LocksConfig
from . import compat
from .server_args import locks_config_of
from .summary_store import summary_bytes_per_page_per_head

logger = logging.getLogger(__name__)

GENERATION_BYTES_PER_PAGE = 8  # page_generation + summary_generation, int32 each
# FlashInfer's BatchDecodeWithPagedKVCacheWrapper allocates this device buffer of its own (--locks-sparse-decode
# flashinfer: one wrapper per LocksDecode).
FLASHINFER_INT_WORKSPACE_BYTES = 8 * 1024 * 1024


def summary_bytes_per_token(config: LocksConfig, locks_layers: int, num_kv_heads: int, head_dim: int) -> float:
    per_page = summary_bytes_per_page_per_head(config, head_dim) * num_kv_heads * locks_layers + GENERATION_BYTES_PER_PAGE
    return per_page / PAGE_SIZE


def locks_layer_count(config: LocksConfig, start_layer: int, end_layer: int) -> int:
    return sum(1 for l in range(start_layer, end_layer) if l not in config.dense_layers)


def add_summary_bytes(cell_size: int, configurator, kvc, num_layers: int) -> int:
    """AFTER hook on DefaultPoolConfigurator._compute_cell_size(kvc, num_layers)."""
    config = locks_config_of(kvc.server_args)
    if config is None:
        return cell_size
    from sglang.srt.runtime_context import get_parallel

    start = kvc.layer_info.start_layer
    layers = locks_layer_count(config, start, start + num_layers)
    heads = kvc.model_config.get_num_kv_heads(get_parallel().attn_tp_size)
    extra = summary_bytes_per_token(config, layers, heads, kvc.model_config.head_dim)
    logger.info("LOCKS: page summaries add %.1f bytes per token to the KV cell size of %d bytes (%.1f %%)",
                extra, cell_size, 100 * extra / max(cell_size, 1))
    return cell_size + int(-(-extra // 1))


class _CountAllocations(TorchDispatchMode):
    """Bytes of the tensors created from no tensor (empty, zeros, ones; not views) while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not any(isinstance(a, torch.Tensor) for a in pytree.tree_leaves((args, kwargs))):
            self.bytes += sum(t.numel() * t.element_size() for t in pytree.tree_leaves(out)
                              if isinstance(t, torch.Tensor))
        return out


def decoder_bytes(config: LocksConfig, capture_bs: Sequence[int], num_qo_heads: int, num_kv_heads: int,
                  head_dim: int) -> int:
    """Device bytes LocksFlashInferAttnBackend allocates for decoding outside the summary store: its workspace
    and, per decode batch size in capture_bs (CUDA graphs), a LocksDecode sharing the prefilter's candidates and
    the SelectionState of the largest. Measured by building them on the meta device with the code that allocates
    them (eager decoders, sized by the running batch, are left to SGLang's activation headroom)."""
    from ..decode import LocksDecode, SelectionState
    from ..scoring import candidate_buffer
    from .attention_backend import LOCKS_WORKSPACE_BYTES

    meta = torch.device("meta")
    # Built with the Triton kernel's wrapper, which holds the same page entries and needs no FlashInfer.
    entries = dataclasses.replace(config, sparse_decode="triton")
    with _CountAllocations() as count:
        workspace = torch.empty(LOCKS_WORKSPACE_BYTES, dtype=torch.uint8, device=meta)
        if capture_bs:
            rows = max(capture_bs) * num_kv_heads
            candidates = candidate_buffer(rows, config, meta)
            state = SelectionState(rows, meta, num_qo_heads // num_kv_heads)
            for bs in capture_bs:
                LocksDecode(entries, workspace, num_qo_heads, num_kv_heads, head_dim, bs, use_cuda_graph=True,
                            candidates=candidates, selection_state=state)
    wrappers = len(capture_bs) if config.sparse_decode == "flashinfer" else 0
    return count.bytes + wrappers * FLASHINFER_INT_WORKSPACE_BYTES


def captured_batch_sizes(server_args) -> Tuple[int, ...]:
    """The decode batch sizes configured for CUDA graphs: at least those SGLang captures (get_batch_sizes_to_capture
    drops the ones above its request slots and adds the slot count below them)."""
    from sglang.srt.model_executor.cuda_graph_config import Backend

    decode = compat.cuda_graph_config(server_args).decode
    return () if decode.backend == Backend.DISABLED else tuple(decode.bs or ())


def reserve_decoder_bytes(available: int, kvc, *args, **kwargs) -> int:
    """AFTER hook on KVCacheConfigurator._profile_available_bytes: the KV pool's budget less decoder_bytes, which
    the attention backend allocates after the pool is sized."""
    config = locks_config_of(kvc.server_args)
    if config is None:
        return available
    from sglang.srt.runtime_context import get_parallel

    tp = get_parallel().attn_tp_size
    mc = kvc.model_config
    capture_bs = captured_batch_sizes(kvc.server_args)
    reserved = decoder_bytes(config, capture_bs, mc.num_attention_heads // tp, mc.get_num_kv_heads(tp), mc.head_dim)
    logger.info("LOCKS: %.1f MiB of decode buffers (workspace, %d CUDA-graph batch sizes) reserved from the KV cache "
                "budget of %.2f GiB", reserved / 2**20, len(capture_bs), available / 2**30)
    return available - reserved
