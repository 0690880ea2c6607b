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
import inspect
import math
import os
from typing import Dict, Optional

import torch

from .config import PAGE_SIZE

# structured_kv's parameters (flags --tokens, --kv-heads, ...) and their allowed [low, high]; high None:
# unbounded, a name: that parameter's value. An integer low: an integer parameter.
_RANGES = {
    "tokens": (1, None),
    "kv_heads": (1, None),
    "group": (1, None),
    "head_dim": (1, None),
    "queries": (1, None),
    "page_rank": (1, "head_dim"),  # orthonormal directions of one page in head_dim dimensions
    "spread": (0.0, None),
    "key_noise": (0.0, None),
    "targets": (1, None),  # 0: a query points at the mean of no directions (NaN)
    "strength": (0.0, None),
    "query_noise": (0.0, None),
    "seed": (0, 2**64 - 1),  # torch.Generator's seeds
}


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
    check_params(locals())  # here locals() is exactly the parameters
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


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _range(name: str, params: Optional[Dict[str, float]] = None) -> str:
    """name's allowed range; with params, a bound set by another parameter shows its value."""
    low, high = _RANGES[name]
    if high is None:
        return f">= {low}"
    if isinstance(high, str):
        high = _flag(high) + ("" if params is None else f" = {params[high]}")
    return f"in [{low}, {high}]"


def check_params(params: Dict[str, float]) -> None:
    """ValueError naming the flag and its allowed range for the first of structured_kv's parameters outside it."""
    for name, (low, high) in _RANGES.items():
        value = params[name]
        high = params[high] if isinstance(high, str) else high
        integer = isinstance(low, int)
        typed = not isinstance(value, bool) and (
            isinstance(value, int) if integer else isinstance(value, (int, float)) and math.isfinite(value)
        )
        if not (typed and low <= value and (high is None or value <= high)):
            kind = "an integer" if integer else "a finite number"
            raise ValueError(f"{_flag(name)} must be {kind} {_range(name, params)}, got {value!r}")


def _check_out(path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise ValueError(f"--out {path}: need a file name in an existing, writable directory")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_locks.synthetic", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    defaults = {name: p.default for name, p in inspect.signature(structured_kv).parameters.items()}
    for name in _RANGES:
        ap.add_argument(_flag(name), type=type(defaults[name]), default=defaults[name],
                        help=f"{_range(name)} (default %(default)s)")
    a = ap.parse_args(argv)
    params = {name: getattr(a, name) for name in _RANGES}
    try:  # both before the generator runs: no traceback and no degenerate file
        check_params(params)
        _check_out(a.out)
    except ValueError as e:  # one line: ap.error would print the usage above it
        ap.exit(2, f"{ap.prog}: error: {e}\n")
    data = structured_kv(**params)
    torch.save(data, a.out)
    print(f"wrote {a.out}: keys {tuple(data['keys'].shape)}, queries {tuple(data['queries'].shape)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
