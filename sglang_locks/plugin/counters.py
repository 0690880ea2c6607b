"""Build/reuse counters: reuse counted where SGLang counts radix-cache hits, reported by /server_info.

GET /server_info -> ``internal_states[i]["locks"]`` (one entry per DP rank).
"""

from __future__ import annotations

from ..config import PAGE_SIZE
from .summary_store import store_for_pool


def count_reused_pages(original, batch):
    """AROUND hook on ScheduleBatch.prepare_for_extend: new cached tokens of each request
    (SGLang's own ``cached_tokens``, own earlier chunks excluded) are sealed pages whose
    summaries are reused, not rebuilt, but for those HiCache loaded back from host memory for
    this batch (counted there, rebuilt)."""
    store = store_for_pool(batch.token_to_kv_pool_allocator.get_kvcache())
    if store is None:
        return original(batch)
    before = [req.cached_tokens for req in batch.reqs]
    result = original(batch)
    cached = sum((req.cached_tokens - n) // PAGE_SIZE for req, n in zip(batch.reqs, before))
    store.count_reused(cached - store.take_loaded_pages())
    return result


def add_locks_state(result, scheduler, *_args):
    """AFTER hook on Scheduler.get_internal_state."""
    store = store_for_pool(scheduler.token_to_kv_pool_allocator.get_kvcache())
    if store is not None:
        result.internal_state["locks"] = store.counters()
    return result
