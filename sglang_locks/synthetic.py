"""A documented generator of structured keys for selector tests and demos.

    python -m sglang_locks.synthetic --out kv.pt [--tokens 8192 --kv-heads 2 --group 4 ...]

It builds the structure LOCKS assumes, by construction, so it can check that an
implementation reaches its oracle; it says nothing about real models (measure
those with keys captured from them). Per KV head:

- keys share a common offset c (real keys have one; it cancels in softmax);
- page j has its own centroid mu_j = c + 0.5 z_j and its own random
  orthonormal page_rank-dimensional subspace B_j, so the global key matrix is
  full-rank while each page is low-rank: k_i = mu_j + a_i B_j + noise,
  a_i ~ N(0, spread^2);
- each decode query picks ``targets`` random tokens; query head g of the group
  points at a random half of them: q = c_dir + strength * mean(unit(k_t - mu_t))
  + query_noise * N(0, I), so attention concentrates on a few pages whose key
  deviations a shared basis cannot all represent.

Values are N(0, I).
"""

from __future__ import annotations

import argparse
from typing import Dict

import torch

from .config import PAGE_SIZE


def structured_kv(
    tokens: int = 8192,
    kv_heads: int = 2,
    group: int = 4,
    head_dim: int = 128,
    queries: int = 16,
    page_rank: int = 4,
    spread: float = 3.0,
    key_noise: float = 0.05,
    targets: int = 8,
    strength: float = 60.0,
    query_noise: float = 0.2,
    seed: int = 0,
) -> Dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    n_pages = -(-tokens // PAGE_SIZE)
    keys = torch.empty(n_pages * PAGE_SIZE, kv_heads, head_dim)
    qs = torch.empty(queries, kv_heads * group, head_dim)
    for h in range(kv_heads):
        common = 2.0 * randn(head_dim)
        mu = common + 0.5 * randn(n_pages, head_dim)
        basis = torch.linalg.qr(randn(n_pages, head_dim, page_rank)).Q.transpose(1, 2)  # [P, r, d]
        coef = spread * randn(n_pages, PAGE_SIZE, page_rank)
        k = mu[:, None] + coef @ basis + key_noise * randn(n_pages, PAGE_SIZE, head_dim)
        keys[:, h] = k.reshape(-1, head_dim)
        dev = (k - mu[:, None]).reshape(-1, head_dim)[:tokens]
        for m in range(queries):
            picks = torch.randint(0, tokens, (targets,), generator=gen)
            for g in range(group):
                half = picks[torch.randperm(targets, generator=gen)[: max(1, targets // 2)]]
                direction = torch.nn.functional.normalize(dev[half], dim=-1).mean(0)
                qs[m, h * group + g] = (
                    common / common.norm() + strength * direction + query_noise * randn(head_dim)
                )
    keys = keys[:tokens]
    return {"keys": keys, "queries": qs, "values": randn(tokens, kv_heads, head_dim)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_locks.synthetic", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--queries", type=int, default=16)
    ap.add_argument("--page-rank", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    data = structured_kv(a.tokens, a.kv_heads, a.group, a.head_dim, a.queries, a.page_rank, seed=a.seed)
    torch.save(data, a.out)
    print(f"wrote {a.out}: keys {tuple(data['keys'].shape)}, queries {tuple(data['queries'].shape)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
