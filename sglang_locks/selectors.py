"""Page selectors behind one interface, for offline evaluation on captured keys.

Each selector sees the context's keys [N, H_kv, d] once (prepare) and then
gives, for decode queries [M, Hq, d], a log-mass estimate per query head and
sealed page [M, Hq, P]. Aggregation over the GQA group, forced pages and top-k
are the same for all of them (aggregate_scores_torch, select_pages), so they
differ only in how they estimate a page's attention mass.

- locks:  per-page centroid + per-page rank-r basis + per-key coefficients (the seed).
- quest:  per-channel min/max of the page's keys; score is the upper bound
          sum_c max(q_c min_c, q_c max_c) of q.k over the page (Quest, Tang et al. 2024).
- shared: one rank-r basis per KV head from the SVD of all of the context's keys
          centred on their page means, plus the page means (the ShadowKV-style
          shared-basis estimator): logsumexp_i (q.mu_j + (W q).(W (k_i - mu_j))).
- oracle: the exact log attention mass of each page; no per-KV-head selector can do better.
"""

from __future__ import annotations

import torch

from .config import PAGE_SIZE
from .summaries import PageSummaries


def _pages(keys: torch.Tensor) -> torch.Tensor:
    """Sealed pages of keys [N, H, d] -> [H, P, 16, d] float32."""
    n_pages = keys.shape[0] // PAGE_SIZE
    x = keys[: n_pages * PAGE_SIZE].float()
    return x.view(n_pages, PAGE_SIZE, *x.shape[1:]).permute(2, 0, 1, 3)


def _by_head(q: torch.Tensor, hkv: int) -> torch.Tensor:
    m, hq, d = q.shape
    return q.float().view(m, hkv, hq // hkv, d)


class LocksSelector:
    def __init__(self, rank: int = 8, precision: str = "int8-int4-int8"):
        self.name = "locks" if precision == "int8-int4-int8" else f"locks:{precision}"
        self.rank, self.precision = rank, precision

    def prepare(self, keys: torch.Tensor, sm_scale: float) -> None:
        self.sm_scale = sm_scale
        n_pages = keys.shape[0] // PAGE_SIZE
        self.summaries = PageSummaries.allocate(n_pages, keys.shape[1], keys.shape[2], self.rank, self.precision, keys.device)
        if n_pages:
            pages = keys[: n_pages * PAGE_SIZE].view(n_pages, PAGE_SIZE, *keys.shape[1:])
            self.summaries.write(torch.arange(n_pages, device=keys.device), pages)

    def head_scores(self, q: torch.Tensor) -> torch.Tensor:
        mu, basis, coef = self.summaries.dequantize()  # [P, H, ...]
        qg = _by_head(q, self.summaries.num_kv_heads)
        qmu = torch.einsum("mhgd,phd->mhgp", qg, mu)
        proj = torch.einsum("mhgd,phrd->mhgpr", qg, basis)
        local = torch.einsum("mhgpr,phir->mhgpi", proj, coef)
        s = torch.logsumexp((qmu[..., None] + local) * self.sm_scale, -1)
        return s.flatten(1, 2)


class QuestSelector:
    name = "quest"

    def prepare(self, keys: torch.Tensor, sm_scale: float) -> None:
        pages = _pages(keys)
        self.kmin, self.kmax = pages.amin(2), pages.amax(2)  # [H, P, d]
        self.sm_scale = sm_scale

    def head_scores(self, q: torch.Tensor) -> torch.Tensor:
        qg = _by_head(q, self.kmin.shape[0])[..., None, :]  # [M, H, G, 1, d]
        bound = torch.maximum(qg * self.kmin[None, :, None], qg * self.kmax[None, :, None]).sum(-1)
        return (bound * self.sm_scale).flatten(1, 2)


class SharedBasisSelector:
    def __init__(self, rank: int = 8):
        self.rank = rank
        self.name = f"shared:{rank}" if rank != 8 else "shared"

    def prepare(self, keys: torch.Tensor, sm_scale: float) -> None:
        pages = _pages(keys)  # [H, P, 16, d]
        self.mu = pages.mean(2)
        dev = pages - self.mu[:, :, None]
        flat = dev.flatten(1, 2).double()  # [H, P*16, d]
        _, _, vh = torch.linalg.svd(flat, full_matrices=False)
        self.basis = vh[:, : self.rank].float()  # [H, r, d]
        self.coef = torch.einsum("hpid,hrd->hpir", dev, self.basis)
        self.sm_scale = sm_scale

    def head_scores(self, q: torch.Tensor) -> torch.Tensor:
        qg = _by_head(q, self.mu.shape[0])
        qmu = torch.einsum("mhgd,hpd->mhgp", qg, self.mu)
        proj = torch.einsum("mhgd,hrd->mhgr", qg, self.basis)
        local = torch.einsum("mhgr,hpir->mhgpi", proj, self.coef)
        return torch.logsumexp((qmu[..., None] + local) * self.sm_scale, -1).flatten(1, 2)


class OracleSelector:
    name = "oracle"

    def prepare(self, keys: torch.Tensor, sm_scale: float) -> None:
        self.pages, self.sm_scale = _pages(keys), sm_scale

    def head_scores(self, q: torch.Tensor) -> torch.Tensor:
        qg = _by_head(q, self.pages.shape[0])
        logits = torch.einsum("mhgd,hpid->mhgpi", qg, self.pages) * self.sm_scale
        return torch.logsumexp(logits, -1).flatten(1, 2)


def make_selector(spec: str, rank: int = 8, precision: str = "int8-int4-int8"):
    """'locks', 'locks:fp32', 'locks:bf16', 'quest', 'shared', 'shared:32', 'oracle'."""
    name, _, arg = spec.partition(":")
    if name == "locks":
        return LocksSelector(rank, arg or precision)
    if name == "shared":
        return SharedBasisSelector(int(arg) if arg else rank)
    if name == "quest" and not arg:
        return QuestSelector()
    if name == "oracle" and not arg:
        return OracleSelector()
    raise ValueError(f"unknown selector {spec!r}: use locks[:fp32|bf16|int8-int4-int8], quest, shared[:RANK], oracle")
