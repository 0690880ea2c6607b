"""--enable-hierarchical-cache with LOCKS: pages HiCache loads back from host memory get their summaries rebuilt by
the next extend (the load-back hook), on SGLang's own pools, allocator and radix cache on the CPU; the flag is
accepted where SGLang has HiRadixCache and refused, naming the release, where it does not."""

import pkgutil
from types import SimpleNamespace

import pytest
import torch

from plugin_helpers import LAYERS, Harness, load_sglang_plugins
from sglang_locks.config import LocksConfig
from sglang_locks.plugin.compat import hicache_load_back_target
from sglang_locks.plugin.summary_store import on_load_back

CFG = LocksConfig(token_budget=64, sink_pages=1, local_pages=1, summary_precision="fp32")  # 4 pages
EVICTED_PAGES = 6


def evict_then_load(h):
    """Request 0's pages are summarised, then released (HiCache moved their KV to host memory and freed them);
    the allocator hands the same physical pages to a load-back of other keys. Returns (loaded token slots,
    their pages): the pages' old summaries, request 0's, must not be scored."""
    r0 = h.new_request()
    h.extend([r0], [16 * EVICTED_PAGES + 5])
    old_pages = h.pages_of(r0)
    assert h.store.is_valid(old_pages).all()
    h.allocator.free(h.req_to_token[r0, : h.seq_lens[r0]].long())
    pages = h.allocator.free_pages[:EVICTED_PAGES].clone()  # what the load-back's alloc takes
    h.allocator.free_pages = h.allocator.free_pages[EVICTED_PAGES:]
    assert set(pages.tolist()) == set(old_pages.tolist())
    slots = (pages[:, None] * 16 + torch.arange(16)).flatten()
    for layer in range(LAYERS):  # the host copy's keys arrive
        h.kv.k_buffer[layer][slots] = h.keys_for(slots.numel())
    return slots, pages


def request_on(h, prefix_slots, own_tokens):
    """A request whose radix hit is the loaded prefix, extended by its own tokens."""
    r = h.new_request()
    h.req_to_token[r, : prefix_slots.numel()] = prefix_slots.to(torch.int32)
    h.extend([r], [own_tokens], prefix_lens=[prefix_slots.numel()])
    return r


def cache_of(h):
    return SimpleNamespace(token_to_kv_pool_allocator=h.allocator)


def test_loaded_pages_are_rebuilt_by_the_next_extend():
    h = Harness(CFG)
    slots, pages = evict_then_load(h)
    on_load_back(slots, cache_of(h), None)
    r = request_on(h, slots, 16 * 2 + 7)
    assert h.store.is_valid(pages).all()
    h.assert_summaries_current(torch.cat([pages, h.pages_of(r)]).unique())
    assert h.stale_scorable([r]) == 0
    counters = h.store.counters()
    assert counters["loaded_pages"] == EVICTED_PAGES
    assert counters["built_pages"] == 2 * EVICTED_PAGES + 2  # request 0's, the loaded ones, the request's own


def test_without_the_hook_loaded_pages_would_be_scored_from_their_old_summaries():
    """What the hook prevents: the loaded pages still hold request 0's summaries, which the scorer would read."""
    h = Harness(CFG)
    slots, pages = evict_then_load(h)
    r = request_on(h, slots, 16 * 2 + 7)
    assert not h.store.is_valid(pages).any()
    assert h.stale_scorable([r]) == EVICTED_PAGES - CFG.sink_pages


def test_a_loaded_page_released_before_its_build_stays_invalid():
    h = Harness(CFG)
    slots, pages = evict_then_load(h)
    on_load_back(slots, cache_of(h), None)
    h.allocator.free(slots[: 2 * 16])  # the first two loaded pages freed again before any forward
    other = h.new_request()
    h.extend([other], [5])  # seals nothing: the forward builds only the loaded pages
    assert not h.store.is_valid(pages[:2]).any()
    assert h.store.is_valid(pages[2:]).all()


def test_nothing_loaded_changes_nothing():
    h = Harness(CFG)
    on_load_back(None, cache_of(h), None)
    on_load_back(torch.zeros(0, dtype=torch.int64), cache_of(h), None)
    assert h.store.counters()["loaded_pages"] == 0


def test_slots_not_in_whole_pages_are_refused():
    h = Harness(CFG)
    with pytest.raises(RuntimeError, match="not whole 16-token pages"):
        on_load_back(torch.arange(20), cache_of(h), None)


def test_loaded_pages_are_not_counted_as_reused():
    """SGLang counts host hits in cached_tokens; the loaded pages are rebuilt, so only the rest is reuse."""
    from sglang_locks.plugin.counters import count_reused_pages

    h = Harness(CFG)
    on_load_back(torch.arange(16 * 4, 16 * 8), cache_of(h), None)  # 4 pages loaded for this batch
    req = SimpleNamespace(cached_tokens=0)

    def prepare_for_extend(batch):
        batch.reqs[0].cached_tokens += 16 * 10  # 6 pages on the device, 4 loaded back

    count_reused_pages(prepare_for_extend, SimpleNamespace(reqs=[req], token_to_kv_pool_allocator=h.allocator))
    assert h.store.reused_pages == 6


def test_flag_accepted_where_sglang_has_hiradix_cache_else_refused_naming_the_release():
    import sglang
    from sglang.srt.server_args import prepare_server_args

    from plugin_helpers import MODEL_DIR

    load_sglang_plugins()
    flags = ["--model-path", MODEL_DIR, "--device", "cpu", "--skip-tokenizer-init", "--enable-locks",
             "--enable-hierarchical-cache"]
    if hicache_load_back_target() is None:
        with pytest.raises(ValueError, match=rf"--enable-hierarchical-cache: SGLang {sglang.__version__} has no "
                                             r"hiradix_cache.HiRadixCache"):
            prepare_server_args(flags)
    else:
        assert prepare_server_args(flags).enable_hierarchical_cache


def test_load_back_hook_wraps_hiradix_cache_where_it_exists():
    target = hicache_load_back_target()
    if target is None:
        pytest.skip("this SGLang has no hiradix_cache module: --enable-hierarchical-cache is refused (test above)")
    load_sglang_plugins()
    module, cls, method = target.rsplit(".", 2)
    assert hasattr(getattr(pkgutil.resolve_name(f"{module}:{cls}"), method), "__wrapped__")
