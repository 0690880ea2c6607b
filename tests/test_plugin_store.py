"""The summary store driven by SGLang's real radix cache, paged allocator and KV pool on the CPU."""

from types import SimpleNamespace

import pytest
import torch

from plugin_helpers import FP8, HEAD_DIM, KV_HEADS, Harness, cached_form
from sglang_locks.config import LocksConfig

CFG = LocksConfig(token_budget=64, sink_pages=1, local_pages=1, summary_precision="fp32")  # 4 pages


@pytest.fixture(params=["backend", "model"])
def h(request):
    """Both kinds of model: the backend writes an extend's KV, or the model does (fused KV write)."""
    return Harness(CFG, kv_writer=request.param)


def cache_request(h, req, token_ids):
    """The radix cache takes the request's page-aligned prefix (as cache_finished_req does)."""
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    n = len(token_ids) // 16 * 16
    h.radix.insert(InsertParams(key=RadixKey(token_ids[:n]), value=h.req_to_token[req, :n].long().clone()))


def match(h, token_ids):
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    result = h.radix.match_prefix(MatchPrefixParams(key=RadixKey(token_ids)))
    if hasattr(result, "device_indices"):  # up to SGLang 0.5.21
        return result.device_indices
    return h.radix.path_device_indices(result.last_device_node)[: result.device_prefix_len]


def test_extend_summarises_each_sealed_page_once(h):
    r = h.new_request()
    h.extend([r], [16 * 5 + 7])
    pages = h.pages_of(r)
    assert len(pages) == 5 and h.store.built_pages == 5
    assert h.store.is_valid(pages).all()
    h.assert_summaries_current(pages)
    tail = h.req_to_token[r, 16 * 5].long() // 16
    assert not h.store.is_valid(tail[None]).any()  # the unsealed tail has no summary


def test_shared_prefix_pages_are_summarised_once_and_reused(h):
    prompt = list(range(16 * 6 + 3))
    r1 = h.new_request()
    h.extend([r1], [len(prompt)])
    cache_request(h, r1, prompt)
    built_before = h.store.built_pages
    # r2 shares the first 4 pages (64 tokens) of r1's prompt, then diverges.
    prompt2 = prompt[:64] + [9999] * 40
    prefix = match(h, prompt2)
    assert prefix.numel() == 64
    r2 = h.new_request()
    h.req_to_token[r2, :64] = prefix.to(torch.int32)
    h.extend([r2], [len(prompt2) - 64], prefix_lens=[64])
    assert torch.equal(h.pages_of(r2, 4), h.pages_of(r1, 4))  # same physical pages
    assert h.store.built_pages - built_before == len(prompt2) // 16 - 4  # only r2's own pages
    assert h.store.is_valid(h.pages_of(r2)).all()
    h.assert_summaries_current(torch.cat([h.pages_of(r1), h.pages_of(r2)]).unique())
    assert h.stale_scorable([r1, r2]) == 0


def test_reuse_counter_counts_new_cached_pages():
    """count_reused_pages: SGLang's cached_tokens growth per request, in pages, own chunks excluded."""
    from sglang_locks.plugin.counters import count_reused_pages

    h = Harness(CFG)
    reqs = [SimpleNamespace(cached_tokens=0), SimpleNamespace(cached_tokens=32)]
    batch = SimpleNamespace(reqs=reqs, token_to_kv_pool_allocator=h.allocator)

    def prepare_for_extend(b):  # what SGLang does: cached_tokens += prefix_len - already_computed
        b.reqs[0].cached_tokens += 64
        b.reqs[1].cached_tokens += 0

    count_reused_pages(prepare_for_extend, batch)
    assert h.store.reused_pages == 4


def test_release_invalidates(h):
    r = h.new_request()
    h.extend([r], [16 * 4])
    pages = h.pages_of(r)
    h.allocator.free(h.req_to_token[r, : 16 * 4].long())
    assert not h.store.is_valid(pages).any()
    assert h.store.counters()["released_pages"] == 4


def test_radix_eviction_invalidates(h):
    prompt = list(range(16 * 3))
    r = h.new_request()
    h.extend([r], [len(prompt)])
    cache_request(h, r, prompt)
    pages = h.pages_of(r)
    assert h.store.is_valid(pages).all()
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    h.radix.evict(EvictParams(num_tokens=16 * 3))
    assert not h.store.is_valid(pages).any()


def test_flush_invalidates_everything(h):
    r = h.new_request()
    h.extend([r], [16 * 4])
    h.allocator.clear()  # flush_cache
    assert not h.store.is_valid(torch.arange(h.store.num_pages)).any()


@pytest.mark.parametrize("chunks", [[16 * 3, 16 * 2 + 5], [16, 16, 16 * 4], [37, 27, 16 * 2 + 1]])
def test_chunked_prefill_builds_every_page_exactly_once(h, chunks):
    r = h.new_request()
    for n in chunks:
        h.extend([r], [n])
    n_sealed = sum(chunks) // 16
    assert h.store.built_pages == n_sealed
    pages = h.pages_of(r)
    assert h.store.is_valid(pages).all()
    h.assert_summaries_current(pages)


def test_decode_seal_is_built_at_the_next_forward_and_forced_until_then(h):
    r = h.new_request()
    h.extend([r], [16 * 6 - 3])
    for _ in range(3):
        h.decode([r])  # the third step seals page 5
    page5 = h.pages_of(r)[5]
    assert not h.store.is_valid(page5[None]).any()  # summarised at the next forward ...
    assert h.stale_scorable([r]) == 0  # ... and forced in as the local page until then
    h.decode([r])
    assert h.store.is_valid(page5[None]).all()
    h.assert_summaries_current(h.pages_of(r))
    assert h.store.built_pages == 6


def test_checker_sees_an_unsummarised_page_scored():
    """With no local page the just-sealed page would be scored before its summary exists."""
    h = Harness(LocksConfig(token_budget=48, sink_pages=1, local_pages=0, summary_precision="fp32"))
    r = h.new_request()
    h.extend([r], [16 * 6 - 1])
    h.decode([r])
    assert h.stale_scorable([r]) == 1


def test_freed_page_reallocated_while_its_build_is_pending(h):
    """Overlap scheduler: r1's decode seals page P; r1 finishes and P is released and reused by
    r2 before the forward that builds P. The pending build must not leave r1's keys in P."""
    r1 = h.new_request()
    h.extend([r1], [16 * 5 - 1])
    h.decode([r1])  # seals page 4 (pending)
    p = h.pages_of(r1)[4]
    h.allocator.free(h.req_to_token[r1, : 16 * 5].long())  # r1 finished: pages released
    r2 = h.new_request()
    # The allocator hands released pages out first: r2's extend (one forward, which starts
    # with the pending build) rewrites and seals P with its own keys.
    h.extend([r2], [16 * 6])
    assert p in h.pages_of(r2)
    assert h.store.is_valid(h.pages_of(r2)).all()
    h.assert_summaries_current(h.pages_of(r2))
    assert h.store.counters()["dropped_released_pages"] == 1
    assert h.stale_scorable([r2]) == 0


def test_pending_build_of_a_released_page_never_validates_it(h):
    """As above, but r2 only partly fills P: P stays invalid (not r1's summary under a new owner)."""
    r1 = h.new_request()
    h.extend([r1], [16 * 2 - 1])
    h.decode([r1])  # seals page 1 (pending)
    h.allocator.free(h.req_to_token[r1, :32].long())
    r2 = h.new_request()
    h.extend([r2], [5])  # takes a released page, unsealed
    h.forward_start()
    assert not h.store.is_valid(torch.arange(1, h.store.num_pages)).any()


def test_reused_stale_page_would_be_detected(h):
    """The stale check is not vacuous: a released page scored as if still sealed is counted."""
    r1 = h.new_request()
    h.extend([r1], [16 * 8])
    pages = h.req_to_token[r1, : 16 * 8].long()
    h.allocator.free(pages)
    assert h.stale_scorable([r1]) == 8 - 1 - 1  # all but the sink and the local page


def test_counters_reach_server_info(h):
    from sglang_locks.plugin.counters import add_locks_state

    r = h.new_request()
    h.extend([r], [16 * 3])
    result = SimpleNamespace(internal_state={})
    add_locks_state(result, SimpleNamespace(token_to_kv_pool_allocator=h.allocator), None)
    assert result.internal_state["locks"]["built_pages"] == 3
    assert result.internal_state["locks"]["store_bytes"] == h.store.nbytes() > 0


def test_page_reused_under_a_model_that_writes_its_own_kv_is_rebuilt():
    """Models with a fused KV write (bailing_moe, sdar, llada2, gpt_oss on CUDA with a bf16 cache) call attention
    with save_kv_cache=False: a page released by r1 and taken by r2 must carry r2's summary, not r1's."""
    h = Harness(CFG, kv_writer="model")
    r1 = h.new_request()
    h.extend([r1], [16 * 6])
    old = h.pages_of(r1)
    h.allocator.free(h.req_to_token[r1, : 16 * 6].long())
    r2 = h.new_request()
    h.extend([r2], [16 * 6])
    pages = h.pages_of(r2)
    assert set(pages.tolist()) & set(old.tolist())  # the allocator handed r1's pages to r2
    assert h.store.is_valid(pages).all()
    h.assert_summaries_current(pages)
    assert h.stale_scorable([r2]) == 0


def test_page_is_valid_only_once_every_locks_layer_is_built(h):
    """An extend whose forward built one layer of two leaves its pages invalid, and the checker counts them."""
    r = h.new_request()
    h.extend([r], [16 * 8], layers=[0])
    assert not h.store.is_valid(h.pages_of(r)).any()
    assert h.stale_scorable([r]) == 8 - 1 - 1  # all but the sink and the local page


def test_layer_attended_again_in_one_forward_is_not_rebuilt(monkeypatch):
    """Models that call a layer's attention again on its cached KV (k=None, save_kv_cache=False, e.g.
    iquest_loopcoder) build its summaries once per forward."""
    h = Harness(CFG)
    r = h.new_request()
    h.extend([r], [16 * 3])
    calls = []
    monkeypatch.setattr(type(h.store.layer(0)), "write_from_cache", lambda *a: calls.append(a))
    h.backend.forward_extend(None, None, None, SimpleNamespace(layer_id=0), None, save_kv_cache=False)
    assert calls == []
    assert h.store.is_valid(h.pages_of(r)).all()
    h.assert_summaries_current(h.pages_of(r))


@pytest.mark.parametrize("kv_writer", ["backend", "model"])
def test_fp8_pool_summaries_are_those_of_the_dequantised_keys(kv_writer):
    """An fp8 pool holds each layer's keys / k_scale (FP8_K_SCALES): the summaries an extend builds and those a
    decode seal's flush builds are what PageSummaries.write makes of fp8 x k_scale. Exactly: both summarise the
    same float32 keys (fp8 widened, times the float32 scale) through the same torch build (the Triton kernel does
    not run in these tests)."""
    h = Harness(CFG, kv_writer=kv_writer, kv_dtype=FP8)
    r = h.new_request()
    h.extend([r], [16 * 5 - 2])
    pages = h.pages_of(r)
    assert h.store.is_valid(pages).all()
    h.assert_summaries_current(pages)
    for _ in range(3):
        h.decode([r])  # the second step seals the fifth page, the third step's forward builds it (flush_pending)
    pages = h.pages_of(r)
    assert len(pages) == 5 and h.store.is_valid(pages).all()
    h.assert_summaries_current(pages)


def test_backend_gives_the_store_of_an_fp8_pool_its_locks_layers_k_scales():
    """_store_for: the k scales of the LOCKS layers in the store's layer order (a dense layer's left out, a layer
    without one at 1.0); its warm-up builds page 0 through both build paths from the dequantised keys."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    from sglang_locks.plugin.attention_backend import LocksFlashInferAttnBackend, _k_scale
    from sglang_locks.summaries import PageSummaries

    pool = MHATokenToKVPool(size=64, page_size=16, dtype=FP8, head_num=KV_HEADS, head_dim=HEAD_DIM, layer_num=3,
                            device="cpu", enable_memory_saver=False)
    layers = [SimpleNamespace(k_scale_float=s) for s in (0.37, 5.0, None)]
    gen = torch.Generator().manual_seed(1)
    for buf, layer in zip(pool.k_buffer, layers):  # page 0, which the warm-up builds
        buf[:16] = cached_form(pool, torch.randn(16, KV_HEADS, HEAD_DIM, generator=gen), _k_scale(layer))

    class Backend(LocksFlashInferAttnBackend):
        def __init__(self):  # none of FlashInfer's set-up
            self.config, self.token_to_kv_pool, self.kv_dtype = CFG, pool, FP8
            self.num_kv_heads, self.head_dim = KV_HEADS, HEAD_DIM
            self.k_scales = {l: _k_scale(layers[l]) for l in (0, 2)}  # layer 1 dense

    store = Backend()._store_for(SimpleNamespace(device="cpu"), [0, 2])
    assert torch.equal(store.k_scales, torch.tensor([0.37, 1.0]))
    for l in (0, 2):
        want = PageSummaries.allocate(1, KV_HEADS, HEAD_DIM, CFG.rank, CFG.summary_precision)
        keys = pool.k_buffer[l][:16].view(FP8).float() * _k_scale(layers[l])
        want.write(torch.zeros(1, dtype=torch.int64), keys[None])
        got = store.layer(l)
        for name in ("mu", "basis", "coef", "mu_scale", "coef_scale"):
            assert torch.equal(getattr(got, name)[:1], getattr(want, name)), (l, name)
