"""page_selection: top pages of each (request, KV head) -> FlashInfer page entries, in one launch.

Output. Row (b, h) of the sparse decode attends 16-token pages of KV head h:
its selected sealed pages (all of them, in logical order, when they fit in
the budget), then the unsealed tail page (0-15 tokens), and the length of its
last page goes to FlashInfer's last_page_len (so that plan() need not copy it
every step). The token-major cache [slots, H_kv, d] is viewed as pages of one
KV head (sparse_decode.per_head_pages): entry slot * H_kv + h is the page
whose first token is slot. In a decode step the launch also stores the
step's keys and values into that cache (CacheWrite), which the tail page
then holds for the sparse decode.

Selection. Scores are aggregated per KV head (aggregate_scores.aggregate_block)
and ranked by one-byte keys (page_key: the page's share of its group's
estimated mass in steps of 1/16 nat). Top-k is a counting select over a row's
pages, which several programs share: (1, where a row's score partials are
many, split_merge, and the score kernel added up no masses) each program
merges a slice of the chunk partials into each head's (max, sum); (2) each
adds its pages' key histogram to the row's (atomics); (3) each finds the k-th
largest key T and writes its pages with key > T and, in page order, as many
with key == T as the budget still holds, at positions that follow from the
earlier programs' histograms. Pages come out in logical order: deterministic,
the exact top-k up to ties within one key step. A program's span follows
from its row's own length, so a short row in a graph sized for a long
context still spreads over all of its row's programs.

Residency. Between the phases a row's programs wait for each other on a
counter (spin), so every program of the grid must be resident at once:
selection_parts caps the grid, and before a grid's first launch the CUDA
driver's occupancy of the compiled kernel confirms it (_resident_grid). The
last program of a row clears its histogram and counter for the next launch.
Triton's interpreter (CPU CI) runs programs one after the other, so there
the phases are launches of their own.

Why one launch: at bs=1 the selection is a chain of dependent round trips to
memory, not bandwidth; every launch more adds its latency to the layer.

The prefilter (scoring.locks_scores_triton) runs the same kernel twice:
candidate_pages_triton selects each row's candidates from the estimate
scores and writes them as a list (logical pages and first slots, page order);
selected_indices_triton with that list selects among the candidates, whose
scores come in candidate order, forcing sink and local pages by their logical
page.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from ._triton import dependent_launch, interpreted, num_sms, pdl_start, resident_blocks
from .aggregate_scores import (AGGREGATIONS, HIST_BINS, aggregate_block, key_offset, merge_partials, page_key,
                               partials_block, row_lse)

PAGE_BLOCK = 512  # pages per program, before the grid's cap (selection_parts)
TILE_VALUES = 8192  # most [G, tile] scores a program loads at once
SELECT_WARPS = 4
SPLIT_MERGE_ABOVE = 2048  # score partials (chunks x query heads) a row's programs each merge whole
MASS_SLOTS = 8  # float64 sums per query head that a score kernel's programs add their masses to


@triton.jit
def _kth_bin(hist, k):
    """Bin holding the k-th largest key of a histogram, and how many keys lie in higher bins."""
    bins = tl.arange(0, HIST_BINS)
    above = tl.sum(hist, 0) - tl.cumsum(hist, 0)
    kth = tl.max(tl.where(above + hist >= k, bins, -1), 0)
    return kth, tl.sum(tl.where(bins > kth, hist, 0), 0)


@triton.jit
def _item(i, mask, table, cand_pages, cand_slots, PAGE: tl.constexpr, STAGE: tl.constexpr):
    """(logical page, first slot) of items i: pages themselves, or (STAGE 2) candidate list entries."""
    if STAGE == 2:
        page = tl.load(cand_pages + i, mask=mask, other=0)
        slot = tl.load(cand_slots + i, mask=mask, other=0)
    else:
        page = i
        slot = tl.load(table + i * PAGE, mask=mask, other=0)
    return page, slot


@triton.jit
def _write(out, out_slots, pos, page, slot, mask, HKV: tl.constexpr, h, STAGE: tl.constexpr):
    """A selected page: a candidate list entry (STAGE 1: page and slot), or FlashInfer's entry of its page of head h."""
    if STAGE == 1:
        tl.store(out + pos, page, mask=mask)
        tl.store(out_slots + pos, slot, mask=mask)
    else:
        tl.store(out + pos, slot * HKV + h, mask=mask)


@triton.jit
def _arrive_and_wait(arrived_ptr, target, SYNC: tl.constexpr):
    """Row barrier: this program's stores are visible to the row's other programs after it, and theirs to it.
    The last to arrive learns it from its own arrival and does not wait."""
    if SYNC:
        tl.debug_barrier()  # the whole program's stores precede the arrival (released at GPU scope)
        seen = tl.atomic_add(arrived_ptr, 1, sem="acq_rel", scope="gpu") + 1
        while seen < target:
            seen = tl.atomic_add(arrived_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()


@triton.jit
def _clear_mass(mass_ptr, qrows, gmask, BLOCK_G: tl.constexpr, SLOTS: tl.constexpr):
    """Zero the query heads' mass slots for the next score launch."""
    slots = tl.arange(0, SLOTS)
    tl.store(mass_ptr + qrows[:, None] * SLOTS + slots[None, :], tl.zeros((BLOCK_G, SLOTS), tl.float64),
             mask=gmask[:, None])


@triton.jit
def _keys_tile(p, end, scores_ptr, qrows, gmask, max_pages, n_items, n_sealed, lse, offset, sink_pages, local_pages,
               cand_pages, key_row, MODE: tl.constexpr, STAGE: tl.constexpr):
    """Phase 2 on items p below end: their keys stored at key_row; returns their histogram."""
    live = p < end
    if STAGE == 2:
        page = tl.load(cand_pages + p, mask=live, other=0)
    else:
        page = p
    agg = aggregate_block(scores_ptr, qrows, gmask, max_pages, p, n_items, page, n_sealed, lse, sink_pages,
                          local_pages, MODE)
    key = page_key(agg, offset)
    tl.store(key_row + p, key, mask=live)
    return tl.histogram(key, HIST_BINS, mask=live)


@triton.jit
def _page_keys(start, end, scores_ptr, qrows, gmask, max_pages, n_items, n_sealed, lse, offset, sink_pages,
               local_pages, cand_pages, key_row, BLOCK: tl.constexpr, TILES: tl.constexpr, MODE: tl.constexpr,
               STAGE: tl.constexpr):
    """Phase 2 over items [start, end), at most TILES tiles of BLOCK: the histogram of their keys."""
    jb = tl.arange(0, BLOCK)
    args = (end, scores_ptr, qrows, gmask, max_pages, n_items, n_sealed, lse, offset, sink_pages, local_pages,
            cand_pages, key_row)
    if TILES == 1:  # no loop: the tile's loads are scheduled freely (a loop, even of one trip, measured slower)
        counts = _keys_tile(start + jb, *args, MODE, STAGE)
    else:
        counts = tl.zeros((HIST_BINS,), tl.int32)
        for p0 in range(start, end, BLOCK):
            counts += _keys_tile(p0 + jb, *args, MODE, STAGE)
    return counts


@triton.jit
def _take_tile(p, end, key_row, thr, ties, ties_seen, taken, table, cand_pages, cand_slots, out, out_slots, h,
               HKV: tl.constexpr, PAGE: tl.constexpr, STAGE: tl.constexpr):
    """Phase 3 on items p below end: writes those with key > thr, and ties (key == thr) while ties_seen < ties,
    from position taken; returns the new (taken, ties_seen)."""
    live = p < end
    key = tl.load(key_row + p, mask=live, other=-1)
    tie = (live & (key == thr)).to(tl.int32)
    take = (live & (key > thr)) | ((tie != 0) & (ties_seen + tl.cumsum(tie, 0) - tie < ties))
    take_i = take.to(tl.int32)
    page, slot = _item(p, take, table, cand_pages, cand_slots, PAGE, STAGE)
    _write(out, out_slots, taken + tl.cumsum(take_i, 0) - take_i, page, slot, take, HKV, h, STAGE)
    return taken + tl.sum(take_i, 0), ties_seen + tl.sum(tie, 0)


@triton.jit
def _take_pages(start, end, key_row, thr, ties, ties_seen, taken, table, cand_pages, cand_slots, out, out_slots, h,
                BLOCK: tl.constexpr, TILES: tl.constexpr, HKV: tl.constexpr, PAGE: tl.constexpr,
                STAGE: tl.constexpr):
    """Phase 3 over items [start, end), at most TILES tiles of BLOCK, in item order."""
    jb = tl.arange(0, BLOCK)
    args = (end, key_row, thr, ties)
    rest = (table, cand_pages, cand_slots, out, out_slots, h)
    if TILES == 1:
        _take_tile(start + jb, *args, ties_seen, taken, *rest, HKV, PAGE, STAGE)
    else:
        for p0 in range(start, end, BLOCK):
            taken, ties_seen = _take_tile(p0 + jb, *args, ties_seen, taken, *rest, HKV, PAGE, STAGE)


@triton.jit
def _select_kernel(
    scores_ptr, part_max_ptr, part_sum_ptr, max_pages, n_score_chunks, part_stride,
    req_to_token_ptr, stride_rt, req_pool_ptr, seq_lens_ptr, indptr_ptr, indices_ptr, last_len_ptr,
    cand_pages_ptr, cand_slots_ptr, n_cand, keys_ptr, hist_ptr, arrived_ptr, suffix_ptr, slice_max_ptr, slice_sum_ptr,
    mass_ptr, sink_pages, local_pages, budget_pages, parts,
    new_k_ptr, new_v_ptr, stride_nkb, stride_nkh, stride_nvb, stride_nvh, k_cache_ptr, v_cache_ptr, loc_ptr, n_slots,
    HKV: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_SLICE: tl.constexpr,
    SPLIT: tl.constexpr, MASS: tl.constexpr, PAGE: tl.constexpr,
    BLOCK: tl.constexpr, SMALL: tl.constexpr, TILES: tl.constexpr, PARTS_P2: tl.constexpr, MODE: tl.constexpr,
    LOG_G: tl.constexpr, PHASE: tl.constexpr, SYNC: tl.constexpr, STAGE: tl.constexpr, PDL: tl.constexpr,
    WRITE_KV: tl.constexpr, D: tl.constexpr,
):
    pdl_start(PDL)
    row = tl.program_id(0)
    part = tl.program_id(1)
    b = row // HKV
    h = row % HKV
    if WRITE_KV:
        # Part 0 of row (b, h) loads the step's key and value of KV head h now and stores them into the caches
        # last (CacheWrite): their loads overlap the selection's.
        dk = tl.arange(0, D)
        writes = (part == 0) & (dk < D)
        new_k = tl.load(new_k_ptr + b.to(tl.int64) * stride_nkb + h * stride_nkh + dk, mask=writes)
        new_v = tl.load(new_v_ptr + b.to(tl.int64) * stride_nvb + h * stride_nvh + dk, mask=writes)
        new_slot = tl.load(loc_ptr + b, mask=part == 0, other=0).to(tl.int64)
        # as SGLang's store: nothing goes to slot 0, the padding rows' of CUDA graphs, or out of the caches
        writes = writes & (new_slot > 0) & (new_slot < n_slots)
        new_at = (new_slot * HKV + h) * D + dk
    jb = tl.arange(0, BLOCK)
    seq_len = tl.load(seq_lens_ptr + b)
    n_sealed = seq_len // PAGE
    req = tl.load(req_pool_ptr + b).to(tl.int64)
    table = req_to_token_ptr + req * stride_rt
    # STAGE 0: a row's items are its sealed pages, its selection goes out as FlashInfer's page entries
    # at the row's indptr, then its tail page. STAGE 1 (the prefilter's candidates): the same items,
    # the selection goes out as a candidate list (logical pages and first slots) at row * n_cand.
    # STAGE 2: the items are the row's first min(n_sealed, n_cand) candidates, scores in candidate
    # order; out as in STAGE 0.
    cand_row = row.to(tl.int64) * n_cand
    cand_pages = cand_pages_ptr + cand_row
    cand_slots = cand_slots_ptr + cand_row
    if STAGE == 1:
        out = cand_pages
        out_slots = cand_slots
    else:
        out = indices_ptr + tl.load(indptr_ptr + row).to(tl.int64)
        out_slots = out
    if STAGE == 2:
        n_items = tl.minimum(n_sealed, n_cand)
    else:
        n_items = n_sealed
    # The row's items are split over its parts programs by its own length (under CUDA graphs the grid
    # follows the longest context the graph serves). A span that fits a SMALL tile is one round trip of
    # it; a wider one goes in BLOCK tiles, the width's (see selection_tiles).
    span = tl.cdiv(tl.cdiv(n_items, parts), 16) * 16
    start = part * span
    end = tl.minimum(start + span, n_items)
    bins = tl.arange(0, HIST_BINS)
    key_row = keys_ptr + row.to(tl.int64) * max_pages
    part_suffix = suffix_ptr + (row * parts + part).to(tl.int64) * HIST_BINS
    g = tl.arange(0, BLOCK_G)
    gmask = g < G
    qrows = (b * HKV * G + h * G + g).to(tl.int64)

    if n_sealed <= budget_pages:  # every sealed page, in order (the same for all of the row's programs)
        if (PHASE == 0) | (PHASE == 3):
            for p0 in range(start, end, BLOCK):
                p = p0 + jb
                live = p < end
                page, slot = _item(p, live, table, cand_pages, cand_slots, PAGE, STAGE)
                _write(out, out_slots, p, page, slot, live, HKV, h, STAGE)
        if MASS > 0:  # not read: cleared for the next launch
            _clear_mass(mass_ptr, qrows, gmask & (part == 0), BLOCK_G, MASS)
    else:
        if SPLIT:
            # Each program merges a slice of the score chunks' partials, then each merges the row's slices,
            # instead of every program reading all of the row's partials (GLM-4-9B-1M bs=1: 528 chunks x 16
            # query heads, several round trips a program).
            srows = (row * G + g).to(tl.int64)   # slices [rows, G, parts]
            if (PHASE == 0) | (PHASE == 1):
                per = tl.cdiv(n_score_chunks, parts)
                c0 = tl.minimum(part * per, n_score_chunks)
                m, sm = merge_partials(part_max_ptr + c0, part_sum_ptr + c0, qrows, gmask,
                                       tl.minimum(per, n_score_chunks - c0), part_stride, BLOCK_G, BLOCK_SLICE, "")
                tl.store(slice_max_ptr + srows * parts + part, m, mask=gmask)
                tl.store(slice_sum_ptr + srows * parts + part, sm, mask=gmask)
            _arrive_and_wait(arrived_ptr + row, parts, SYNC)
        if (PHASE == 0) | (PHASE == 2):
            if MASS > 0:  # each head's total from the score kernel; 0 for a head without pages, as row_lse
                slots = tl.arange(0, MASS)
                mass = tl.sum(tl.load(mass_ptr + qrows[:, None] * MASS + slots[None, :], mask=gmask[:, None],
                                      other=0.0, cache_modifier=".cg"), 1)
                lse = tl.log(tl.where(mass > 0, mass, 1.0)).to(tl.float32)
            elif SPLIT:
                lse = row_lse(slice_max_ptr, slice_sum_ptr, srows, gmask, parts, parts, BLOCK_G, BLOCK_N, ".cg")
            else:
                lse = row_lse(part_max_ptr, part_sum_ptr, qrows, gmask, n_score_chunks, part_stride, BLOCK_G, BLOCK_N,
                              "")
            offset = key_offset(lse, gmask, MODE, LOG_G)
            key_args = (start, end, scores_ptr, qrows, gmask, max_pages, n_items, n_sealed, lse, offset, sink_pages,
                        local_pages, cand_pages, key_row)
            if SMALL == BLOCK:  # one tile size: one code path (no branch compiled)
                counts = _page_keys(*key_args, BLOCK, TILES, MODE, STAGE)
            elif span <= SMALL:
                counts = _page_keys(*key_args, SMALL, 1, MODE, STAGE)
            else:
                counts = _page_keys(*key_args, BLOCK, TILES, MODE, STAGE)
            tl.atomic_add(hist_ptr + row * HIST_BINS + bins, counts, mask=counts > 0, sem="relaxed")
            tl.store(part_suffix + bins, tl.sum(counts, 0) - tl.cumsum(counts, 0) + counts)
        _arrive_and_wait(arrived_ptr + row, (1 + SPLIT) * parts, SYNC)

        if (PHASE == 0) | (PHASE == 3):
            hist = tl.load(hist_ptr + row * HIST_BINS + bins, cache_modifier=".cg")
            thr, above = _kth_bin(hist, budget_pages)
            ties = budget_pages - above   # pages with key == thr to take, in page order
            # Pages of the programs before this one with key >= thr and key > thr.
            pp = tl.arange(0, PARTS_P2)
            before = pp < part
            earlier = suffix_ptr + (row * parts + pp).to(tl.int64) * HIST_BINS
            at_or_above = tl.sum(tl.load(earlier + thr, mask=before, other=0, cache_modifier=".cg"), 0)
            over = tl.sum(tl.load(earlier + thr + 1, mask=before & (thr + 1 < HIST_BINS), other=0,
                                  cache_modifier=".cg"), 0)
            ties_seen = at_or_above - over
            taken = over + tl.minimum(ties_seen, ties)
            take_args = (start, end, key_row, thr, ties, ties_seen, taken, table, cand_pages, cand_slots, out,
                         out_slots, h)
            if SMALL == BLOCK:
                _take_pages(*take_args, BLOCK, TILES, HKV, PAGE, STAGE)
            elif span <= SMALL:
                _take_pages(*take_args, SMALL, 1, HKV, PAGE, STAGE)
            else:
                _take_pages(*take_args, BLOCK, TILES, HKV, PAGE, STAGE)
        if PHASE == 0:
            # The last program to finish clears the row's histogram and counter (all others are past
            # their last read of them).
            if SYNC:
                done = tl.atomic_add(arrived_ptr + row, 1, sem="acq_rel", scope="gpu") == (2 + SPLIT) * parts - 1
            else:
                done = True
            if done:
                tl.store(hist_ptr + row * HIST_BINS + bins, tl.zeros((HIST_BINS,), tl.int32))
                tl.store(arrived_ptr + row, 0)
                if MASS > 0:
                    _clear_mass(mass_ptr, qrows, gmask, BLOCK_G, MASS)
    if STAGE != 1:
        if (part == 0) & ((PHASE == 0) | (PHASE == 3)):
            tail = seq_len - n_sealed * PAGE
            tl.store(last_len_ptr + row, tl.where(tail > 0, tail, PAGE))  # FlashInfer's last page: tail or sealed
            if tail > 0:
                slot = tl.load(table + n_sealed * PAGE)
                tl.store(out + tl.minimum(n_sealed, budget_pages), slot * HKV + h)
            if WRITE_KV:
                tl.store(k_cache_ptr + new_at, new_k, mask=writes)
                tl.store(v_cache_ptr + new_at, new_v, mask=writes)


class PageScores(NamedTuple):
    """A score launch's hand-off to the selection: scores [B, Hq, P] (natural-log mass at each logical page, or
    with candidates in candidate order [B, Hq, M]), per-chunk (max, sum of exp) partials [B, Hq, chunks] (all
    chunks merged), the prefilter's candidate list [2, >= B * H_kv, M] (None: every sealed page was scored), and
    mass: float64 [>= B * Hq, slots], each query head's mass that the score kernel added up (SelectionState.mass,
    no candidates; None: the selection merges the partials)."""

    scores: torch.Tensor
    part_max: torch.Tensor
    part_sum: torch.Tensor
    candidates: Optional[torch.Tensor] = None
    mass: Optional[torch.Tensor] = None


class CacheWrite(NamedTuple):
    """The decode step's keys and values k, v [B, H_kv, d] (unit stride along d), which the selection writes into
    the caches k_cache, v_cache [slots, H_kv, d] (contiguous) at slots loc [B]: the sparse decode after it reads
    them from there, and the scores before it never do, so no store launch of its own precedes the chain. Like
    SGLang's store, it writes nothing to slot 0 (where CUDA graphs' padding rows point) or past the caches."""

    k: torch.Tensor
    v: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    loc: torch.Tensor

    def check(self, batch: int, num_kv_heads: int) -> None:
        k, v, kc, vc, loc = self
        d = kc.shape[-1]
        for name, t in (("k", k), ("v", v)):
            if t.dim() != 3 or tuple(t.shape) != (batch, num_kv_heads, d) or t.stride(-1) != 1:
                raise ValueError(f"CacheWrite.{name} must be [{batch}, {num_kv_heads}, {d}] with unit stride "
                                 f"along d, got {tuple(t.shape)} strides {t.stride()}")
        for name, t in (("k_cache", kc), ("v_cache", vc)):
            if t.dim() != 3 or t.shape[1:] != kc.shape[1:] or t.shape[1] != num_kv_heads or not t.is_contiguous():
                raise ValueError(f"CacheWrite.{name} must be a contiguous [slots, {num_kv_heads}, {d}] cache, got "
                                 f"{tuple(t.shape)}")
        if k.dtype != kc.dtype or v.dtype != vc.dtype:
            raise ValueError(f"CacheWrite: keys/values {k.dtype}/{v.dtype} into caches {kc.dtype}/{vc.dtype} "
                             "(no conversion)")
        if loc.dim() != 1 or loc.shape[0] < batch:
            raise ValueError(f"CacheWrite.loc must hold >= {batch} slots, got {tuple(loc.shape)}")


class SelectionState:
    """What selected_indices_triton keeps between launches: per row a key histogram and a barrier
    counter, and per query head (up to max_group a row) the float64 mass a score kernel adds up for the
    selection after it (score_pages_gluon's mass), all zero between launches (the kernel clears them).
    One per stream of launches: decoders that run one after the other may share one (LocksDecode's
    selection_state)."""

    def __init__(self, max_rows: int, device, max_group: int = 16) -> None:
        self.rows, self.max_group = max_rows, max_group
        self.hist = torch.zeros(max_rows, HIST_BINS.value, dtype=torch.int32, device=device)
        self.arrived = torch.zeros(max_rows, dtype=torch.int32, device=device)
        self.mass = torch.zeros(max_rows * max_group, MASS_SLOTS, dtype=torch.float64, device=device)


def selection_parts(rows: int, items: int, device: torch.device, group: int, block: int = None) -> int:
    """Programs per row: up to one per block of items, as many as let the whole grid be resident at once
    (the row barrier needs it): with the smallest tile (selection_tile) whose resident_programs per SM
    hold the grid, else 2 per SM, which any registers allow (<= 255 x 128 threads each). E.g. Llama-3.1-8B
    bs=4 at 128K+: 17 programs per row of 512-page tiles, not 8 of 2048 (half of each masked in a 132096-token
    graph)."""
    sms = num_sms(device)
    items = max(items, 1)
    most = triton.cdiv(items, block or PAGE_BLOCK)
    tile = selection_tile(items, most, group)
    while True:
        parts = min(most, triton.cdiv(items, tile))
        if rows * parts <= resident_programs(tile, group) * sms:
            return parts
        if tile * triton.next_power_of_2(group) >= TILE_VALUES:
            return max(1, min(most, 2 * sms // rows))
        tile *= 2


def resident_programs(tile: int, group: int) -> int:
    """Selection programs an SM holds at once with [G, tile] scores: 8 at tiles of <= 512 pages and <= 16 score
    values per thread, half as many as either doubles, at least 2 (which any registers allow). ptxas (sm_90)
    gives G = 4: 47, 96 and 168 registers at tiles of 512, 1024 and 2048 (room for 10, 5 and 3 programs of 4
    warps); tests/test_kernels_build.py checks the builds against this."""
    values = triton.next_power_of_2(group) * tile // (32 * SELECT_WARPS)
    return max(2, 8 // max(1, tile // 512, values // 16))


def selection_tile(items: int, parts: int, group: int) -> int:
    """Items a program loads at a time: its whole span where [G, tile] scores stay within TILE_VALUES,
    which keeps a row's programs to one round trip each."""
    span = triton.next_power_of_2(triton.cdiv(max(items, 1), parts))
    return max(16, min(span, TILE_VALUES // triton.next_power_of_2(group)))


def selection_tiles(items: int, parts: int, group: int) -> tuple:
    """(tile, small tile): selection_tile of rows items wide, and the one rows of a quarter of that or
    less use (under CUDA graphs a launch sized for the longest context also selects short rows). At 8+
    query heads per KV head, none (as measured on the H200 with the split merge)."""
    tile = selection_tile(items, parts, group)
    return tile, tile if group >= 8 else max(16, tile // 4)


def split_merge(n_chunks: int, parts: int, group: int) -> bool:
    """Whether a row's programs merge the score partials in slices (a barrier more) rather than each merging
    all of them: where those are more than SPLIT_MERGE_ABOVE values."""
    return parts > 1 and n_chunks * triton.next_power_of_2(group) > SPLIT_MERGE_ABOVE


# Items a program of the final selection over candidates handles at a time: with ~1K candidates
# per row, blocks of 1024 would leave one program per row.
CANDIDATE_BLOCK = 256
_STAGES = {"pages": 0, "candidates": 1, "among_candidates": 2}


def _launch_select(stage, scores, part_max, part_sum, score_chunks, req_to_token, req_pool_indices, seq_lens, indptr,
                   indices, last_page_len, candidates, num_kv_heads, sink_pages, local_pages, mode, budget_pages,
                   state, cache_write: CacheWrite = None, mass: torch.Tensor = None):
    bsz, hq, width = scores.shape
    group = hq // num_kv_heads
    rows = bsz * num_kv_heads
    if rows > state.rows:
        raise ValueError(f"{rows} rows exceed the SelectionState's {state.rows}")
    if mass is not None and (mass.dtype != torch.float64 or mass.dim() != 2 or mass.shape[0] < bsz * hq
                             or not mass.is_contiguous() or mass.shape[1] & (mass.shape[1] - 1) or stage != "pages"):
        raise ValueError(f"mass must be a contiguous float64 [>= {bsz * hq}, power-of-two slots] tensor (a selection "
                         f"of every sealed page), got {mass.dtype} {tuple(mass.shape)} ({stage})")
    if candidates is None:
        cand_pages = cand_slots = seq_lens  # not read
        n_cand = 0
    else:
        if candidates.dim() != 3 or candidates.shape[0] != 2 or not candidates.is_contiguous():
            raise ValueError("candidates must be a contiguous [2, rows, M] tensor (logical pages, first slots)")
        if candidates.shape[1] < rows:
            raise ValueError(f"candidates hold {candidates.shape[1]} rows, fewer than {rows}")
        cand_pages, cand_slots = candidates[0], candidates[1]
        n_cand = candidates.shape[2]
    n_chunks = part_max.shape[-1] if score_chunks is None else score_chunks
    device = scores.device
    launch = {"PHASE": 0, **dependent_launch(device, "select")}
    if cache_write is None:
        write_args = (seq_lens, seq_lens, 0, 0, 0, 0, seq_lens, seq_lens, seq_lens, 0)  # not read
        write_consts = dict(WRITE_KV=0, D=16)
    else:
        cache_write.check(bsz, num_kv_heads)
        k, v, k_cache, v_cache, loc = cache_write
        write_args = (k, v, k.stride(0), k.stride(1), v.stride(0), v.stride(1), k_cache, v_cache, loc, k_cache.shape[0])
        write_consts = dict(WRITE_KV=1, D=k_cache.shape[-1])

    def grid(parts):
        """The launch's arguments and compile-time constants at parts programs per row."""
        block, small = selection_tiles(width, parts, group)
        keys = torch.empty(rows, width, dtype=torch.int32, device=device)
        suffix = torch.empty(rows, parts, HIST_BINS.value, dtype=torch.int32, device=device)
        split = mass is None and split_merge(n_chunks, parts, group)
        # the slices' (max, sum) scratch [rows, G, parts], only where the partials are merged in slices
        slices = (torch.empty(2, rows, group, parts, dtype=torch.float32, device=device) if split
                  else (part_max, part_sum))  # not read
        args = (scores, part_max, part_sum, width, n_chunks, part_max.shape[-1],
                req_to_token, req_to_token.stride(0), req_pool_indices, seq_lens, indptr, indices, last_page_len,
                cand_pages, cand_slots, n_cand, keys, state.hist, state.arrived, suffix, slices[0], slices[1],
                slices[0] if mass is None else mass, sink_pages, local_pages, budget_pages, parts, *write_args)
        consts = dict(**write_consts, HKV=num_kv_heads, G=group, BLOCK_G=triton.next_power_of_2(group),
                      BLOCK_N=partials_block(parts if split else n_chunks, group),
                      BLOCK_SLICE=partials_block(triton.cdiv(n_chunks, parts), group), SPLIT=int(split),
                      MASS=0 if mass is None else mass.shape[1], PAGE=16,
                      BLOCK=block, SMALL=small,
                      TILES=triton.cdiv(triton.cdiv(max(width, 1), parts), block),
                      PARTS_P2=triton.next_power_of_2(parts), MODE=AGGREGATIONS[mode],
                      LOG_G=math.log(group), STAGE=_STAGES[stage], SYNC=parts > 1, num_warps=SELECT_WARPS)
        return args, consts

    parts = selection_parts(rows, width, device, group, CANDIDATE_BLOCK if stage == "among_candidates" else PAGE_BLOCK)
    if interpreted():  # programs run one after the other: one launch per phase
        args, consts = grid(parts)
        for phase in (1, 2, 3) if consts["SPLIT"] else (2, 3):
            _select_kernel[(rows, parts)](*args, **{**consts, "PHASE": phase, "SYNC": False, "PDL": 0})
        state.hist.zero_()
        if mass is not None:
            mass.zero_()
        return
    key = (device.index, rows, parts, width, n_chunks, group, num_kv_heads, mode, stage, req_to_token.dtype,
           seq_lens.dtype, req_pool_indices.dtype, launch["PDL"], write_consts["D"] if cache_write else 0,
           0 if mass is None else mass.shape[1])
    if key not in _RESIDENT_PARTS:
        _RESIDENT_PARTS[key] = _resident_grid(grid, rows, parts, num_sms(device), launch)
    parts = _RESIDENT_PARTS[key]
    args, consts = grid(parts)
    _select_kernel[(rows, parts)](*args, **launch, **consts)


_RESIDENT_PARTS = {}  # selection_parts' grid -> the parts _resident_grid keeps


def _resident_grid(grid, rows: int, parts: int, sms: int, launch: dict) -> int:
    """parts, or fewer where the CUDA driver says that the kernel they compile to (whose registers
    resident_programs models from sm_90 builds; another GPU or compiler may differ) does not fit rows x parts
    programs on the GPU at once, which the row barrier needs."""
    while parts > 1:
        args, consts = grid(parts)
        per_sm = resident_blocks(_select_kernel.warmup(*args, grid=(rows, parts), **launch, **consts))
        fewer = resident_parts(rows, parts, sms, per_sm)
        if fewer == parts:
            break
        parts = fewer
    return parts


def resident_parts(rows: int, parts: int, sms: int, per_sm: int) -> int:
    """Programs per row for a grid of rows x parts programs of which an SM holds per_sm at once (0: unknown):
    parts where they all fit at once (the row barrier needs it) or per_sm is unknown, else fewer."""
    if per_sm == 0 or rows * parts <= per_sm * sms:
        return parts
    return max(1, min(parts - 1, per_sm * sms // rows))


def selected_indices_triton(scored: PageScores, req_to_token, req_pool_indices, seq_lens, indptr, indices,
                            last_page_len, num_kv_heads, sink_pages, local_pages, mode, budget_pages,
                            state: SelectionState, cache_write: CacheWrite = None):
    """Select and write page entries, from a score launch's PageScores.

    indptr [B * H_kv + 1] in pages (selection.selected_pages). Writes each row's
    entries at indptr: its top pages in logical order, then its tail page; and
    the length of its last page (the tail's, or 16) at last_page_len[row]
    (int32, >= B * H_kv). With candidates, the top pages are chosen among each
    row's candidates, in candidate (= logical) order. With cache_write, it also
    writes the step's keys and values into the caches (CacheWrite). With mass,
    each query head's total mass is read instead of the partials, and zeroed
    for the next launch.
    """
    scores, part_max, part_sum, candidates, mass = scored
    stage = "pages" if candidates is None else "among_candidates"
    rows = scores.shape[0] * num_kv_heads
    if last_page_len.numel() < rows or last_page_len.dtype != torch.int32:
        raise ValueError(f"last_page_len must hold >= {rows} int32 values, got {last_page_len.numel()} "
                         f"{last_page_len.dtype}")
    _launch_select(stage, scores, part_max, part_sum, None, req_to_token, req_pool_indices, seq_lens, indptr, indices,
                   last_page_len, candidates, num_kv_heads, sink_pages, local_pages, mode, budget_pages, state,
                   cache_write, mass)
    return indices


def candidate_pages_triton(scores, part_max, part_sum, score_chunks, req_to_token, req_pool_indices, seq_lens,
                           candidates, num_kv_heads, sink_pages, local_pages, mode, state: SelectionState):
    """The prefilter's candidates: per (request, KV head) row the M = candidates.shape[2] best-scored
    sealed pages (forced pages first; every sealed page when they fit) in page order, their logical
    pages at candidates[0, row, :min(n_sealed, M)] and their first slots at candidates[1, row, ...].
    Partials: the first score_chunks of part_max's."""
    m = candidates.shape[2]
    _launch_select("candidates", scores, part_max, part_sum, score_chunks, req_to_token, req_pool_indices, seq_lens,
                   seq_lens, seq_lens, seq_lens, candidates, num_kv_heads, sink_pages, local_pages, mode, m, state)
    return candidates


def select_pages_by_key_torch(agg, key_offset, budget_pages, **key_rule):
    """Reference of the kernel's top-k: per row the pages with the budget_pages largest keys,
    ties at the k-th key taken in page order; logical page ids [B * H_kv, k] in ascending order.
    key_rule: page_key_torch's scale / span, for keys of other resolutions."""
    from .aggregate_scores import page_key_torch

    rows = agg.shape[0] * agg.shape[1]
    flat = agg.reshape(rows, -1)
    keys = page_key_torch(flat, key_offset, **key_rule)
    keys = torch.where(flat == float("-inf"), torch.full_like(keys, -1), keys)  # padding never competes
    k = min(budget_pages, flat.shape[1])
    out = torch.zeros(rows, k, dtype=torch.int64)
    for row in range(rows):
        kth = keys[row].topk(k).values[-1] if k else 0
        above = (keys[row] > kth).nonzero().flatten()
        ties = (keys[row] == kth).nonzero().flatten()[: k - above.numel()]
        out[row] = torch.cat([above, ties]).sort().values
    return out


def selected_indices_torch(sel, req_to_token, req_pool_indices, seq_lens, num_kv_heads, budget_pages):
    """Reference: top-k pages sel [B * H_kv, >= budget_pages] -> (indptr [rows + 1], page entries), row by row."""
    out, lens = [], []
    for b in range(seq_lens.shape[0]):
        seq_len = int(seq_lens[b])
        n_sealed = seq_len // 16
        table = req_to_token[int(req_pool_indices[b])].long()
        for h in range(num_kv_heads):
            row = b * num_kv_heads + h
            pages = torch.arange(n_sealed) if n_sealed <= budget_pages else sel[row, :budget_pages].long().cpu()
            if seq_len > n_sealed * 16:
                pages = torch.cat([pages, torch.tensor([n_sealed])])  # the tail page
            out.append(table[(pages * 16).to(table.device)] * num_kv_heads + h)
            lens.append(pages.numel())
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.tensor(lens).cumsum(0)
    return indptr, torch.cat(out).to(torch.int32)
