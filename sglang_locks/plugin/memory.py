"""Summary bytes in SGLang's KV budget: added to the per-token cell size, so the KV pool shrinks to make room."""

from __future__ import annotations

import logging

from ..config import PAGE_SIZE, LocksConfig
from .server_args import locks_config_of
from .summary_store import summary_bytes_per_page_per_head

logger = logging.getLogger(__name__)

GENERATION_BYTES_PER_PAGE = 8  # page_generation + summary_generation, int32 each


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
