"""SGLang's own KV pools, paged allocator and radix cache on the CPU, with a LOCKS summary store attached.

``Harness`` plays the parts of the scheduler and the attention backend that
touch pages: extend (allocate, write keys, summarise the sealed pages, as
forward_extend does), decode steps (seal recording and the next forward's
flush) and the radix cache's caching of requests.
"""

import os
from types import SimpleNamespace

import torch

MODEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tiny-llama")
LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 16
FP8 = torch.float8_e4m3fn
# An fp8 pool's per-layer scales (RadixAttention's k_scale_float, v_scale_float): not 1, and not one for both
# layers, so that a scale dropped or taken from another layer changes the keys.
FP8_K_SCALES, FP8_V_SCALES = (0.37, 2.5), (1.7, 0.6)


def cached_form(kv, values, scale):
    """values as SGLang's set_kv_buffer stores them in kv: an fp8 pool holds values / scale as float8_e4m3fn
    bytes; others the values as they are."""
    if kv.dtype != FP8:
        return values
    return (values / scale).to(FP8).view(kv.store_dtype)


def load_sglang_plugins():
    from sglang.srt.plugins import load_plugins

    load_plugins()


def extend_backend(store, kv, req_to_token_pool):
    """LOCKS's attention backend as far as extend goes (_plan_extend, forward_extend), on the CPU: FlashInfer's
    own forward_extend, which the backend calls first, is a stand-in that writes the KV when asked to."""
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

    from sglang_locks.plugin.attention_backend import LocksFlashInferAttnBackend

    class StockExtend(FlashInferAttnBackend):
        def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
            if save_kv_cache:
                kv = self.token_to_kv_pool
                kv.k_buffer[layer.layer_id][forward_batch.out_cache_loc] = cached_form(kv, k, layer.k_scale_float)
            return q

    class Backend(LocksFlashInferAttnBackend, StockExtend):  # super() in LOCKS's methods is StockExtend
        def __init__(self):  # none of FlashInfer's set-up
            self.store, self.token_to_kv_pool, self.req_to_token_pool, self.sealed = store, kv, req_to_token_pool, None

    return Backend()


class Harness:
    """kv_writer: who writes an extend's KV, "backend" (save_kv_cache=True) or "model" (a fused KV write
    before attention, which then gets save_kv_cache=False). kv_dtype: the pool's, float32 or FP8 (its layers
    with FP8_K_SCALES and FP8_V_SCALES, the store with the k scales, as the attention backend makes it)."""

    def __init__(self, config, pages=64, max_context=1024, kv_writer="backend", kv_dtype=torch.float32):
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache import memory_pool
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixCache

        from sglang_locks.plugin.summary_store import SummaryStore, attach_store

        load_sglang_plugins()
        # The pools live on the CPU, but SGLang picks its KV store kernel by the machine (CUDA-only on a GPU one).
        memory_pool._is_cuda = False
        size = pages * 16
        self.req_to_token_pool = ReqToTokenPool(size=8, max_context_len=max_context, device="cpu",
                                                enable_memory_saver=False)
        self.kv = MHATokenToKVPool(size=size, page_size=16, dtype=kv_dtype, head_num=KV_HEADS,
                                   head_dim=HEAD_DIM, layer_num=LAYERS, device="cpu", enable_memory_saver=False)
        self.allocator = PagedTokenToKVPoolAllocator(size, 16, kv_dtype, "cpu", self.kv, need_sort=False)
        self.radix = RadixCache(CacheInitParams(disable=False, req_to_token_pool=self.req_to_token_pool,
                                                token_to_kv_pool_allocator=self.allocator, page_size=16))
        fp8 = kv_dtype == FP8
        # SGLang's RadixAttention: tensor scales for set_kv_buffer, float ones for attention (None: unscaled).
        self.layers = [SimpleNamespace(layer_id=l, k_scale_float=FP8_K_SCALES[l] if fp8 else None,
                                       v_scale_float=FP8_V_SCALES[l] if fp8 else None,
                                       k_scale=torch.tensor(FP8_K_SCALES[l]) if fp8 else None,
                                       v_scale=torch.tensor(FP8_V_SCALES[l]) if fp8 else None)
                       for l in range(LAYERS)]
        num_pages = self.kv.get_key_buffer(0).shape[0] // 16
        self.store = SummaryStore(config, range(LAYERS), num_pages, KV_HEADS, HEAD_DIM, "cpu",
                                  k_scales=torch.tensor(FP8_K_SCALES) if fp8 else None)
        attach_store(self.kv, self.store)
        self.backend = extend_backend(self.store, self.kv, self.req_to_token_pool)
        self.kv_writer = kv_writer
        self.gen = torch.Generator().manual_seed(0)
        self.seq_lens = {}  # req pool index -> tokens in the cache

    @property
    def req_to_token(self):
        return self.req_to_token_pool.req_to_token

    def new_request(self) -> int:
        pool = self.req_to_token_pool
        if hasattr(pool, "alloc_rows"):  # SGLang >= 0.5.19: rows without a Req (alloc reads req.kv)
            return pool.alloc_rows(1)[0]
        return pool.alloc([SimpleNamespace(req_pool_idx=None)])[0]

    def keys_for(self, n):
        return torch.randn(n, KV_HEADS, HEAD_DIM, generator=self.gen)

    def forward_start(self):
        """What every forward does first (the backend's init_forward_metadata)."""
        self.store.flush_pending(self.kv)

    def extend(self, reqs, extend_lens, prefix_lens=None, layers=range(LAYERS)):
        """One extend forward through the layers given: reqs continue from their cached length (or the given
        radix prefix)."""
        from sglang.srt.mem_cache.allocator.paged import alloc_extend_naive

        self.forward_start()
        prefix = [self.seq_lens.get(r, 0) if prefix_lens is None else prefix_lens[i] for i, r in enumerate(reqs)]
        seq = [p + n for p, n in zip(prefix, extend_lens)]
        last_loc = torch.tensor([int(self.req_to_token[r, p - 1]) if p else -1 for r, p in zip(reqs, prefix)])
        need_pages = sum(-(-s // 16) - -(-p // 16) for p, s in zip(prefix, seq))
        free = self.allocator.free_pages[:need_pages]
        self.allocator.free_pages = self.allocator.free_pages[need_pages:]
        out = torch.empty(sum(extend_lens), dtype=torch.int64)
        alloc_extend_naive(torch.tensor(prefix), torch.tensor(seq), last_loc, free, out, 16, "cpu")
        at = 0
        for r, p, s in zip(reqs, prefix, seq):
            self.req_to_token[r, p:s] = out[at : at + s - p].to(torch.int32)
            at += s - p
            self.seq_lens[r] = s
        fb = SimpleNamespace(req_pool_indices=torch.tensor(reqs), extend_prefix_lens_cpu=prefix,
                             seq_lens_cpu=torch.tensor(seq), out_cache_loc=out)
        self.backend._plan_extend(fb)
        for layer in layers:
            k = self.keys_for(out.numel())
            if self.kv_writer == "model":
                self.kv.k_buffer[layer][out] = cached_form(self.kv, k, self.layers[layer].k_scale_float)
            self.backend.forward_extend(None, k, k, self.layers[layer], fb, save_kv_cache=self.kv_writer == "backend")
        return out

    def decode(self, reqs):
        """One decode step: allocate each request's next slot, record seals, write the keys."""
        from sglang.srt.mem_cache.allocator.paged import alloc_extend_naive

        self.forward_start()
        prefix = torch.tensor([self.seq_lens[r] for r in reqs])
        need = int((prefix % 16 == 0).sum())
        free = self.allocator.free_pages[:need]
        self.allocator.free_pages = self.allocator.free_pages[need:]
        last_loc = torch.stack([self.req_to_token[r, self.seq_lens[r] - 1].long() for r in reqs])
        out = torch.empty(len(reqs), dtype=torch.int64)
        alloc_extend_naive(prefix, prefix + 1, last_loc, free, out, 16, "cpu")
        for r, loc in zip(reqs, out):
            self.req_to_token[r, self.seq_lens[r]] = int(loc)
            self.seq_lens[r] += 1
        seq = torch.tensor([self.seq_lens[r] for r in reqs])
        self.store.record_decode_seals(self.req_to_token, torch.tensor(reqs), seq.tolist())
        for layer in range(LAYERS):
            self.kv.k_buffer[layer][out] = cached_form(self.kv, self.keys_for(len(reqs)),
                                                       self.layers[layer].k_scale_float)
        return out

    def pages_of(self, req, n_pages=None):
        n = self.seq_lens[req] // 16 if n_pages is None else n_pages
        return (self.req_to_token[req, : n * 16 : 16].long() // 16)

    def stale_scorable(self, reqs):
        seq = torch.tensor([self.seq_lens[r] for r in reqs])
        return int(self.store.stale_scorable_pages(self.req_to_token, torch.tensor(reqs), seq))

    def keys_at(self, layer, slots):
        """The layer's cached keys at slots in float32, an fp8 pool's dequantised (fp8 value x k scale)."""
        keys = self.kv.k_buffer[layer][slots]
        if self.kv.dtype != FP8:
            return keys.float()
        return keys.view(FP8).float() * self.layers[layer].k_scale_float

    def expected_summary(self, layer, pages):
        """Summaries of the pages' current keys, built from scratch."""
        from sglang_locks.summaries import PageSummaries

        cfg = self.store.config
        fresh = PageSummaries.allocate(len(pages), KV_HEADS, HEAD_DIM, cfg.rank, cfg.summary_precision)
        slots = pages[:, None] * 16 + torch.arange(16)
        fresh.write(torch.arange(len(pages)), self.keys_at(layer, slots))
        return fresh

    def assert_summaries_current(self, pages):
        for layer in range(LAYERS):
            got, want = self.store.layer(layer), self.expected_summary(layer, pages)
            for name in ("mu", "basis", "coef", "mu_scale", "coef_scale"):
                assert torch.equal(getattr(got, name)[pages], getattr(want, name)), (layer, name)
