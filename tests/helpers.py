"""Random paged caches shaped like SGLang's: a token-major KV pool and a req_to_token table."""

import random

import torch

from sglang_locks.kernels.score_pages import row_chunks
from sglang_locks.summaries import PageSummaries


def random_cache(seq_lens, num_kv_heads, head_dim, precision="int8-int4-int8", rank=8, device="cpu",
                 dtype=torch.bfloat16, seed=0):
    """Requests of the given lengths on scattered physical pages; summaries of every sealed page."""
    gen = torch.Generator().manual_seed(seed)
    pages_per_req = [-(-n // 16) for n in seq_lens]
    num_pages = sum(pages_per_req) + 3  # page 0 unused, like SGLang's allocator
    perm = torch.randperm(num_pages - 1, generator=gen) + 1
    max_ctx = max(16, max(pages_per_req) * 16)
    req_to_token = torch.zeros(len(seq_lens) + 1, max_ctx, dtype=torch.int32)
    at = 0
    for i, n_pages in enumerate(pages_per_req):
        pages = perm[at : at + n_pages]
        at += n_pages
        req_to_token[i + 1, : n_pages * 16] = (pages[:, None] * 16 + torch.arange(16)).reshape(-1)
    k = page_keys(num_pages, num_kv_heads, head_dim, gen)
    v = torch.randn(num_pages * 16, num_kv_heads, head_dim, generator=gen)
    summaries = summaries_of(k, rank, precision, device)
    req_pool_indices = torch.arange(1, len(seq_lens) + 1, dtype=torch.int32)
    # Shuffle request order so that pool row != batch row.
    order = torch.randperm(len(seq_lens), generator=gen)
    return dict(
        k_cache=k.to(device, dtype), v_cache=v.to(device, dtype), summaries=summaries,
        req_to_token=req_to_token.to(device),
        req_pool_indices=req_pool_indices[order].to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32)[order].to(device),
    )


def page_keys(num_pages, num_kv_heads, head_dim, gen):
    """Keys [num_pages * 16, H_kv, d] with a common offset and per-page structure, like real post-RoPE keys."""
    k = torch.randn(num_pages * 16, num_kv_heads, head_dim, generator=gen)
    k += 2 * torch.randn(num_pages, 1, num_kv_heads, head_dim, generator=gen).repeat_interleave(16, 0).view_as(k)
    return k


def summaries_of(k, rank, precision, device):
    """Summaries of every page of keys k [pages * 16, H_kv, d]."""
    num_pages, hkv, d = k.shape[0] // 16, k.shape[1], k.shape[2]
    summaries = PageSummaries.allocate(num_pages, hkv, d, rank, precision, device)
    summaries.write(torch.arange(num_pages, device=device), k.to(device).view(num_pages, 16, hkv, d))
    return summaries


def slot_masses(part_max, part_sum, slots):
    """Each query head's mass [B * Hq, slots] from chunk partials [B, Hq, chunks], as the Gluon score kernels add
    it up (float64, chunk c's at slot c % slots)."""
    chunk_mass = (part_sum.double() * part_max.double().exp()).flatten(0, 1)
    out = torch.zeros(chunk_mass.shape[0], slots, dtype=torch.float64, device=chunk_mass.device)
    return out.index_add_(1, torch.arange(chunk_mass.shape[1], device=chunk_mass.device) % slots, chunk_mass)


def assert_head_mass(mass, before, part_max, part_sum, ref, tol):
    """The float64 masses a Gluon score launch added to mass [B * Hq, slots] (each slot of which held before):
    each query head's sum of e^score over its sealed pages, chunk c's at slot c % slots, against the launch's
    own chunk partials (to float32 rounding) and the float64 reference scores ref [B, Hq, P] (to tol)."""
    n = ref.shape[0] * ref.shape[1]
    own = slot_masses(part_max, part_sum, mass.shape[1])
    assert mass.dtype == torch.float64 and torch.allclose(mass[:n] - before, own, rtol=1e-5, atol=1e-12)
    got = (mass[:n] - before).sum(-1)
    want = torch.where(torch.isfinite(ref), ref.exp(), 0).sum(-1).flatten().to(mass.device)
    assert torch.allclose(got, want, rtol=tol, atol=0)
    assert (mass[n:] == before).all()  # only the launch's heads


def assert_chunk_partials(part_max, part_sum, ref, seq_lens, block_pages, tol):
    """A score launch's chunk partials (max, sum of exp of each program's scores; a row's sealed pages split
    over its chunks in whole blocks of block_pages) against the float64 reference scores ref [B, Hq, P]."""
    n_chunks = part_max.shape[-1]
    lse_ref = torch.full(part_max.shape, float("-inf"), dtype=torch.float64)
    for b, n in enumerate(seq_lens.tolist()):
        width = row_chunks(n // 16, n_chunks, block_pages)
        for j in range(n_chunks):
            lse_ref[b, :, j] = torch.logsumexp(ref[b, :, j * width : (j + 1) * width].cpu(), -1)
    lse_ref = lse_ref.to(part_max.device)
    lse = part_max.double() + part_sum.double().log()
    fin = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), fin)
    assert torch.allclose(lse[fin], lse_ref[fin], atol=tol, rtol=tol)


def shared_prefix_batch(seed, groups, alone, own_pages, diverge=False, device="cpu", pool_pages=5000):
    """SGLang-like tables: each group's requests start on the same physical pages (a prefix of shared_len
    tokens, possibly ending mid-page: the page holding its end is each request's own), then own pages; some
    requests share nothing; with diverge, one member of each group leaves the prefix early."""
    rng = random.Random(seed)
    next_page = iter(rng.sample(range(1, pool_pages), pool_pages - 1))  # page 0 unused, like SGLang's allocator
    tables, lens = [], []
    for members, shared_len in groups:
        prefix = [next(next_page) for _ in range(shared_len // 16)]
        for m in range(members):
            own_len = rng.randrange(0, own_pages * 16)
            pages = list(prefix)
            if diverge and m == members - 1 and len(pages) > 2:
                cut = rng.randrange(1, len(pages))
                pages = pages[:cut] + [next(next_page) for _ in range(len(pages) - cut)]
            n = len(pages) * 16 + (shared_len % 16) + own_len
            pages += [next(next_page) for _ in range(-(-n // 16) - len(pages))]
            tables.append(pages)
            lens.append(n)
    for _ in range(alone):
        n = rng.randrange(0, own_pages * 16)
        tables.append([next(next_page) for _ in range(-(-n // 16))])
        lens.append(n)
    order = list(range(len(lens)))
    rng.shuffle(order)
    tables, lens = [tables[i] for i in order], [lens[i] for i in order]
    width = max(max(lens), 1) + 16
    req_to_token = torch.zeros(len(lens) + 3, width, dtype=torch.int32)
    rpi = torch.tensor(rng.sample(range(1, len(lens) + 3), len(lens)), dtype=torch.int32)
    for r, pages, n in zip(rpi.tolist(), tables, lens):
        slots = (torch.tensor(pages, dtype=torch.int64)[:, None] * 16 + torch.arange(16)).flatten()[:n]
        req_to_token[r, :n] = slots.to(torch.int32)
    sealed = [t[: n // 16] for t, n in zip(tables, lens)]
    return (req_to_token.to(device), rpi.to(device), torch.tensor(lens, dtype=torch.int32, device=device)), sealed
