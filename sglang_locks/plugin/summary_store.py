"""Summary store: LOCKS page summaries beside SGLang's KV pool, keyed by physical page.

One ``PageSummaries`` holds every LOCKS layer (row ``slot * num_pages + page``),
so a page sealed at decode is summarised for all layers in one batched call;
``layer(layer_id)`` is a view for the scorer.

Validity. ``page_generation[p]`` counts the allocator's releases of page p;
``summary_generation[p]`` is the generation its summary was built for. A
summary is valid iff the two agree. A page sealed by an extend is stamped with
the generation it had when the extend was planned once its summary is built for
every LOCKS layer (``build_layer``), whoever wrote the layer's KV: the
attention backend, or the model itself (fused KV writes call attention with
save_kv_cache=False); a layer left unbuilt leaves the page invalid. Pages sealed by a decode step are summarised at the start of the
next forward (outside the decode CUDA graph: how many pages a step seals
varies), in one build launch for all layers, with the generation read when the
step sealed them: a page released in between is written to page 0 (never
mapped by SGLang's allocator) instead.
Until then the page is the request's last sealed page, which the scorer
forces in (local_pages >= 1) without reading its summary.

All bookkeeping is device work on the caller's stream: no host syncs.
"""

from __future__ import annotations

import collections
import weakref
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

import torch

from ..config import PAGE_SIZE, LocksConfig
from ..summaries import PageSummaries, cached_keys

# The KV pool a store belongs to -> the store (the allocator hooks only see the pool).
_STORES: "weakref.WeakKeyDictionary[object, SummaryStore]" = weakref.WeakKeyDictionary()


def store_for_pool(kv_pool) -> Optional["SummaryStore"]:
    return _STORES.get(kv_pool)


def attach_store(kv_pool, store: "SummaryStore") -> None:
    _STORES[kv_pool] = store


def _layer_view(summaries: PageSummaries, start: int, stop: int) -> PageSummaries:
    return PageSummaries(
        mu=summaries.mu[start:stop],
        mu_scale=summaries.mu_scale[start:stop],
        basis=summaries.basis[start:stop],
        coef=summaries.coef[start:stop],
        coef_scale=summaries.coef_scale[start:stop],
        precision=summaries.precision,
    )


def summary_bytes_per_page_per_head(config: LocksConfig, head_dim: int) -> int:
    return PageSummaries.allocate(1, 1, head_dim, config.rank, config.summary_precision).bytes_per_page_per_head()


class SealedPages:
    """Pages sealed by one extend: physical page ids [n], their token slots [n, 16] and their generation
    when the extend was planned [n] (device), and the LOCKS layers whose summaries are built so far."""

    def __init__(self, pages: torch.Tensor, slots: torch.Tensor, generation: torch.Tensor):
        self.pages, self.slots, self.generation = pages, slots, generation
        self.built_layers: Set[int] = set()

    def __len__(self) -> int:
        return self.pages.numel()


class SummaryStore:
    def __init__(self, config: LocksConfig, layer_ids: Sequence[int], num_pages: int, num_kv_heads: int,
                 head_dim: int, device, k_scales: Optional[torch.Tensor] = None) -> None:
        """k_scales: float32 [layers] on the device, the k scales of an fp8 KV cache (its buffers hold keys /
        k_scale) in layer_ids order, whose dequantised keys the summaries are built from; None for 16-bit caches."""
        self.config = config
        self.k_scales = k_scales
        self.num_pages = num_pages  # page 0 included
        self.slot_of_layer: Dict[int, int] = {l: i for i, l in enumerate(layer_ids)}
        self.summaries = PageSummaries.allocate(
            len(layer_ids) * num_pages, num_kv_heads, head_dim, config.rank, config.summary_precision, device)
        self._views = {l: _layer_view(self.summaries, i * num_pages, (i + 1) * num_pages)
                       for l, i in self.slot_of_layer.items()}
        self._layer_rows = torch.arange(len(layer_ids), dtype=torch.int64, device=device) * num_pages  # first rows
        self.page_generation = torch.zeros(num_pages, dtype=torch.int32, device=device)
        self.summary_generation = torch.full((num_pages,), -1, dtype=torch.int32, device=device)
        self._pending: List[Tuple[torch.Tensor, torch.Tensor]] = []  # (pages, generation when sealed)
        self._loaded: List[SealedPages] = []  # HiCache load-backs the next extend builds (record_loaded)
        self.loaded_pages = 0  # pages loaded back from host memory, each rebuilt (host count)
        self._loaded_uncounted = 0  # of those, not yet subtracted from a reuse count (take_loaded_pages)
        self.built_pages = 0  # pages handed to a build (host count)
        self.reused_pages = 0  # sealed pages of radix-cache hits, never rebuilt
        self.released_pages = 0  # pages the allocator released one by one (host count; clears not included)
        self.decode_steps: Dict[str, int] = collections.Counter()  # per variant (graph_variants)
        self._dropped = torch.zeros((), dtype=torch.int64, device=device)  # released before their build
        self._stale_scorable = torch.zeros((), dtype=torch.int64, device=device)  # see check_scorable

    # ------------------------------------------------------------------ layout
    @property
    def layer_ids(self) -> Iterable[int]:
        return self.slot_of_layer.keys()

    def layer(self, layer_id: int) -> PageSummaries:
        return self._views[layer_id]

    def nbytes(self) -> int:
        s = self.summaries
        tensors = (s.mu, s.mu_scale, s.basis, s.coef, s.coef_scale, self.page_generation, self.summary_generation)
        return sum(t.numel() * t.element_size() for t in tensors)

    # ------------------------------------------------------------------ invalidation (allocator hooks)
    def invalidate(self, *page_ids: torch.Tensor) -> None:
        for ids in page_ids:
            if ids.numel():
                self.page_generation[ids.to(self.page_generation.device)] += 1
                self.released_pages += ids.numel()

    def invalidate_all(self) -> None:
        self.page_generation += 1

    def is_valid(self, pages: torch.Tensor) -> torch.Tensor:
        return self.summary_generation[pages] == self.page_generation[pages]

    # ------------------------------------------------------------------ extend
    def sealed_by_extend(self, req_to_token, req_pool_indices, prefix_lens_cpu, seq_lens_cpu) -> SealedPages:
        """Page j of a request seals in an extend iff prefix_len < 16 (j + 1) <= seq_len."""
        device = req_to_token.device
        first = torch.as_tensor(prefix_lens_cpu, dtype=torch.int64) // PAGE_SIZE
        counts = (torch.as_tensor(seq_lens_cpu, dtype=torch.int64) // PAGE_SIZE - first).clamp_min(0)
        total = int(counts.sum())
        if total == 0:
            return self._with_loaded(SealedPages(torch.zeros(0, dtype=torch.int64, device=device),
                                                 torch.zeros(0, PAGE_SIZE, dtype=torch.int64, device=device),
                                                 torch.zeros(0, dtype=torch.int32, device=device)))
        rows = torch.repeat_interleave(torch.arange(counts.numel()), counts)
        page_in_req = torch.arange(total) - torch.repeat_interleave(counts.cumsum(0) - counts, counts) + first[rows]
        rows_t = rows.to(device, non_blocking=True)
        pos = (page_in_req * PAGE_SIZE).to(device, non_blocking=True)
        req = req_pool_indices.to(torch.int64)[rows_t]
        slots = req_to_token[req[:, None], pos[:, None] + torch.arange(PAGE_SIZE, device=device)].to(torch.int64)
        pages = slots[:, 0] // PAGE_SIZE
        self.built_pages += total
        return self._with_loaded(SealedPages(pages, slots, self.page_generation[pages]))

    # ------------------------------------------------------------------ HiCache load-back
    def record_loaded(self, device_indices: torch.Tensor) -> None:
        """Token slots HiCache loaded host KV back into (page-aligned, device): those pages hold another
        occupant's summary. The next extend, the forward that waits for each layer's load before its
        attention, builds them with its own sealed pages (rebuilt rather than copied with the KV: see
        docs/design.md, "HiCache")."""
        if device_indices.numel() % PAGE_SIZE:
            raise RuntimeError(f"HiCache loaded {device_indices.numel()} token slots, not whole {PAGE_SIZE}-token "
                               "pages (LOCKS needs --page-size 16)")
        slots = device_indices.to(torch.int64).reshape(-1, PAGE_SIZE)
        pages = slots[:, 0] // PAGE_SIZE
        self._loaded.append(SealedPages(pages, slots, self.page_generation[pages]))  # indexing copies
        self.built_pages += pages.numel()
        self.loaded_pages += pages.numel()
        self._loaded_uncounted += pages.numel()

    def take_loaded_pages(self) -> int:
        """Pages loaded back since the last call: SGLang counts them as cached tokens, yet they are rebuilt."""
        n, self._loaded_uncounted = self._loaded_uncounted, 0
        return n

    def _with_loaded(self, sealed: SealedPages) -> SealedPages:
        if not self._loaded:
            return sealed
        parts = [sealed, *self._loaded]
        self._loaded.clear()
        return SealedPages(*(torch.cat([getattr(p, name) for p in parts]) for name in ("pages", "slots", "generation")))

    def build_layer(self, layer_id: int, k_buffer: torch.Tensor, sealed: SealedPages) -> None:
        """Summarise one layer's keys of the sealed pages, once per extend (called once the layer's KV is in
        the cache); the pages become valid when every LOCKS layer is built."""
        if not len(sealed) or layer_id not in self._views or layer_id in sealed.built_layers:
            return
        slot = self.slot_of_layer[layer_id]
        k_scale = None if self.k_scales is None else self.k_scales[slot : slot + 1]
        self._views[layer_id].write_from_cache(sealed.pages[None], [k_buffer], sealed.slots, k_scale)
        sealed.built_layers.add(layer_id)
        if len(sealed.built_layers) == len(self._views):
            self.summary_generation[sealed.pages] = sealed.generation

    # ------------------------------------------------------------------ decode
    def record_decode_seals(self, req_to_token, req_pool_indices, seq_lens: Sequence[int]) -> None:
        """A decode step whose seq_len (this step's token included) is a multiple of 16 seals that page.
        seq_lens: the step's, a list (plain Python: this runs on the host before every decode step)."""
        sealing = [i for i, n in enumerate(seq_lens) if n > 0 and n % PAGE_SIZE == 0]
        if not sealing:
            return
        device = req_to_token.device
        last = torch.tensor([seq_lens[i] - 1 for i in sealing], dtype=torch.int64).to(device, non_blocking=True)
        req = req_pool_indices[torch.tensor(sealing).to(device, non_blocking=True)].to(torch.int64)
        pages = req_to_token[req, last].to(torch.int64) // PAGE_SIZE
        self._pending.append((pages, self.page_generation[pages].clone()))
        self.built_pages += len(sealing)

    def flush_pending(self, kv_pool) -> None:
        """Summarise, for every LOCKS layer at once, the pages sealed by earlier decode steps."""
        if not self._pending:
            return
        pages = torch.cat([p for p, _ in self._pending])
        sealed_gen = torch.cat([g for _, g in self._pending])
        self._pending.clear()
        alive = self.page_generation[pages] == sealed_gen
        self._dropped += (~alive).sum()
        target = torch.where(alive, pages, torch.zeros_like(pages))
        slots = pages[:, None] * PAGE_SIZE + torch.arange(PAGE_SIZE, device=pages.device)
        rows = target[None, :] + self._layer_rows[:, None]
        self.summaries.write_from_cache(rows, [kv_pool.get_key_buffer(l) for l in self.layer_ids], slots,
                                        self.k_scales)
        self.summary_generation[target] = torch.where(alive, sealed_gen, self.summary_generation[target])

    def warm_up(self, kv_pool) -> None:
        """Build page 0 (never mapped by SGLang's allocator) through both build paths, so that their
        kernels are compiled at start-up, not in the first request's decode steps."""
        slots = torch.arange(PAGE_SIZE, dtype=torch.int64, device=self.page_generation.device)[None]
        buffers = [kv_pool.get_key_buffer(l) for l in self.layer_ids]
        self.summaries.write_from_cache(self._layer_rows[:, None], buffers, slots, self.k_scales)
        k_scale = None if self.k_scales is None else self.k_scales[0]
        self.summaries.write(self._layer_rows[:1], cached_keys(buffers[0], slots, k_scale))

    # ------------------------------------------------------------------ checks and counters
    def stale_scorable_pages(self, req_to_token, req_pool_indices, seq_lens) -> torch.Tensor:
        """Pages the scorer would read a summary of, whose summary is not valid (device count).

        Scored from summaries: pages [sink, sealed - local) of a request with
        more sealed pages than the budget; the rest are attended without one.
        """
        cfg = self.config
        n_sealed = seq_lens.to(torch.int64) // PAGE_SIZE
        max_pages = max(1, req_to_token.shape[1] // PAGE_SIZE)
        j = torch.arange(max_pages, device=req_to_token.device)
        scored = (j >= cfg.sink_pages) & (j < (n_sealed - cfg.local_pages)[:, None])
        scored &= (n_sealed > cfg.budget_pages)[:, None]
        slots = req_to_token[req_pool_indices.to(torch.int64)][:, j * PAGE_SIZE].to(torch.int64)
        pages = torch.where(scored, slots // PAGE_SIZE, torch.zeros_like(slots))
        return (scored & ~self.is_valid(pages)).sum()

    def check_scorable(self, req_to_token, req_pool_indices, seq_lens) -> None:
        """Accumulate stale_scorable_pages into the stale_scorable counter (debug mode, no sync)."""
        self._stale_scorable += self.stale_scorable_pages(req_to_token, req_pool_indices, seq_lens)

    def count_reused(self, pages: int) -> None:
        self.reused_pages += pages

    def count_step(self, variant: str) -> None:
        self.decode_steps[variant] += 1

    def device_counts(self) -> torch.Tensor:
        """The counters kept on the device, [dropped released pages, stale scorable pages] (int64)."""
        return torch.stack([self._dropped, self._stale_scorable])

    def counters(self, device_counts: Optional[Sequence[int]] = None) -> Dict[str, int]:
        """device_counts: device_counts() as read earlier (the audit's copy, which need not wait for the device);
        None: read now."""
        dropped, stale = (int(x) for x in (self.device_counts() if device_counts is None else device_counts))
        return {
            "built_pages": self.built_pages - dropped,
            "reused_pages": self.reused_pages,
            "loaded_pages": self.loaded_pages,
            "released_pages": self.released_pages,
            "dropped_released_pages": dropped,
            "stale_scorable_pages": stale,
            "store_bytes": self.nbytes(),
            "locks_decode_steps": self.decode_steps["locks"],
            "dense_decode_steps": self.decode_steps["dense"],
        }


# ---------------------------------------------------------------------- allocator hooks
def on_release_pages(_result, allocator, *page_ids: torch.Tensor) -> None:
    """AFTER hook on PagedTokenToKVPoolAllocator._release_page_ids: every release (finish, abort,
    eviction, duplicate prefix, flush) ends here."""
    store = store_for_pool(allocator.get_kvcache())
    if store is not None:
        store.invalidate(*page_ids)


def on_load_back(result, cache, *_args, **_kwargs) -> None:
    """AFTER hook on HiRadixCache.load_back: result, the device token slots the host KV goes to (None: not
    loaded)."""
    if result is None or not result.numel():
        return
    store = store_for_pool(cache.token_to_kv_pool_allocator.get_kvcache())
    if store is not None:
        store.record_loaded(result)


def on_allocator_clear(_result, allocator) -> None:
    """AFTER hook on PagedTokenToKVPoolAllocator.clear (start-up, flush_cache, resize)."""
    store = store_for_pool(allocator.get_kvcache())
    if store is not None:
        store.invalidate_all()
