"""Page selectors behind one interface, for offline evaluation on captured keys.

Each selector sees the context's keys [N, H_kv, d] once (prepare) and then
gives, for decode queries [M, Hq, d], a log-mass estimate per query head and
sealed page [M, Hq, P]. Aggregation over the GQA group, forced pages and top-k
are the same for all of them (aggregate_scores_torch, select_pages), so they
differ only in how they estimate a page's attention mass.

- locks:  per-page centroid + per-page rank-r basis + per-key coefficients (the seed).
- locks-prefilter:F[:R]  the decode prefilter (--locks-prefilter F --locks-prefilter-rank R):
          every page estimated from its centroid and first R ranks, the best F x budget
          pages scored in full and the budget chosen among them (its selection depends on
          the budget: select_pages_for).
- quest:  per-channel min/max of the page's keys; score is the upper bound
          sum_c max(q_c min_c, q_c max_c) of q.k over the page (Quest, Tang et al. 2024).
- shared: one rank-r basis per KV head from the SVD of all of the context's keys
          centred on their page means, plus the page means (the ShadowKV-style
          shared-basis estimator): logsumexp_i (q.mu_j + (W q).(W (k_i - mu_j))).
- oracle: the exact log attention mass of each page; no per-KV-head selector can do better.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from .config import PAGE_SIZE, SUMMARY_PRECISIONS, LocksConfig
from .scoring import prefiltered, prefiltered_aggregate_torch
from .selection import select_pages
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

    def head_scores(self, q: torch.Tensor, ranks: int = None) -> torch.Tensor:
        """LOCKS scores [M, Hq, P]; ranks: from the centroid and the first ranks ranks only (0: q . mu + log 16)."""
        mu, basis, coef = self.summaries.dequantize()  # [P, H, ...]
        ranks = basis.shape[-2] if ranks is None else ranks
        qg = _by_head(q, self.summaries.num_kv_heads)
        qmu = torch.einsum("mhgd,phd->mhgp", qg, mu)
        proj = torch.einsum("mhgd,phrd->mhgpr", qg, basis[:, :, :ranks])
        local = torch.einsum("mhgpr,phir->mhgpi", proj, coef[..., :ranks])
        s = torch.logsumexp((qmu[..., None] + local) * self.sm_scale, -1)
        return s.flatten(1, 2)


class LocksPrefilterSelector(LocksSelector):
    def __init__(self, factor: int, estimate_rank: int = 0, rank: int = 8, precision: str = "int8-int4-int8"):
        super().__init__(rank, precision)
        self.factor, self.estimate_rank = factor, estimate_rank
        self.name = f"locks-prefilter:{factor}:{estimate_rank}"

    def head_scores(self, q: torch.Tensor) -> torch.Tensor:
        self.estimates = super().head_scores(q, self.estimate_rank)
        return super().head_scores(q)

    def select_pages_for(self, scores: torch.Tensor, seq_lens: torch.Tensor, config: LocksConfig) -> torch.Tensor:
        """The prefilter's selection [M * H_kv, k] from head_scores' scores of the same queries."""
        cfg = dataclasses.replace(config, prefilter=self.factor, prefilter_rank=self.estimate_rank)
        estimates = self.estimates if prefiltered(cfg, scores.shape[-1]) else None
        agg = prefiltered_aggregate_torch(scores, estimates, seq_lens, self.summaries.num_kv_heads, cfg)
        return select_pages(agg, cfg.budget_pages)


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


SELECTOR_SPECS = "locks[:fp32|bf16|int8-int4-int8], locks-prefilter:F[:R], quest, shared[:RANK], oracle"


def _integer(text: str, low: int, high: Optional[int] = None) -> Optional[int]:
    """text as an integer in [low, high] (high None: unbounded), else None."""
    try:
        value = int(text)
    except ValueError:
        return None
    return value if low <= value and (high is None or value <= high) else None


def make_selector(spec: str, rank: int = 8, precision: str = "int8-int4-int8"):
    """'locks', 'locks:fp32', 'locks:bf16', 'locks-prefilter:8', 'locks-prefilter:8:2', 'quest', 'shared',
    'shared:32', 'oracle'; ValueError naming the spec and the range of its argument otherwise."""
    name, _, arg = spec.partition(":")
    if name == "locks":
        if arg and arg not in SUMMARY_PRECISIONS:
            raise ValueError(f"selector {spec!r}: locks:PRECISION takes one of {', '.join(SUMMARY_PRECISIONS)}")
        return LocksSelector(rank, arg or precision)
    if name == "locks-prefilter":
        factor, _, estimate_rank = arg.partition(":")
        factor, estimate_rank = _integer(factor, 1), _integer(estimate_rank or "0", 0, rank)
        if factor is None or estimate_rank is None:
            raise ValueError(f"selector {spec!r}: locks-prefilter:F[:R] takes F >= 1 candidate pages per budget page "
                             f"and R in [0, rank = {rank}] estimate ranks")
        return LocksPrefilterSelector(factor, estimate_rank, rank, precision)
    if name == "shared":
        shared_rank = _integer(arg, 1) if arg else rank
        if shared_rank is None:  # ranks above d keep every direction: the keys' own deviations, exactly
            raise ValueError(f"selector {spec!r}: shared:RANK takes RANK >= 1 basis vectors")
        return SharedBasisSelector(shared_rank)
    if name == "quest" and not arg:
        return QuestSelector()
    if name == "oracle" and not arg:
        return OracleSelector()
    raise ValueError(f"unknown selector {spec!r}: use {SELECTOR_SPECS}")
