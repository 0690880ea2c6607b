"""The page-local low-rank hypothesis, measured: how much of each page's centred key energy
a rank-r basis of its own captures, against one basis shared by the whole context.

For keys [N, H, d] of one layer, with pages of 16 keys centred on their own
mean (the residual LOCKS' basis must explain):

- per_page[r]:  sum over pages of the top-r eigenvalues of the page's 16x16 Gram
                matrix / total centred energy (each page its own best rank-r basis);
- shared[R]:    energy of the centred keys in the top-R principal directions of
                all of the head's centred keys (one basis per head, as the
                shared-basis selector);
- shared_layer[R]: the same with the layer's KV heads concatenated ([N, H*d],
                ShadowKV's per-layer rank-160 setting; R >= d is not trivial there).
"""

from __future__ import annotations

from typing import Dict, Iterable

import torch

from sglang_locks.config import PAGE_SIZE


def _centred_pages(keys: torch.Tensor) -> torch.Tensor:
    """[N, H, d] -> [H, P, 16, d] float64, each page minus its mean."""
    n_pages = keys.shape[0] // PAGE_SIZE
    x = keys[: n_pages * PAGE_SIZE].double().view(n_pages, PAGE_SIZE, *keys.shape[1:]).permute(2, 0, 1, 3)
    return x - x.mean(2, keepdim=True)


def _top_energy_share(cov: torch.Tensor, ranks: Iterable[int], total: torch.Tensor) -> Dict[int, torch.Tensor]:
    eig = torch.linalg.eigvalsh(cov).flip(-1).clamp_min(0)  # descending
    return {r: (eig[..., :r].sum(-1) / total) for r in ranks}


@torch.no_grad()
def energy_fractions(keys: torch.Tensor, page_ranks=(2, 4, 8), shared_ranks=(8, 32),
                     layer_ranks=(8, 32, 160)) -> dict:
    """Per KV head lists (and per layer numbers) of captured centred-key energy fractions."""
    dev = _centred_pages(keys)  # [H, P, 16, d]
    h = dev.shape[0]
    total = dev.pow(2).sum((1, 2, 3))  # [H]
    gram = dev @ dev.transpose(-1, -2)  # [H, P, 16, 16]
    page_eig = torch.linalg.eigvalsh(gram).flip(-1).clamp_min(0).sum(1)  # [H, 16] summed over pages
    flat = dev.flatten(1, 2)  # [H, P*16, d]
    shared = _top_energy_share(flat.transpose(1, 2) @ flat, shared_ranks, total)
    joint = flat.permute(1, 0, 2).reshape(flat.shape[1], -1)  # [P*16, H*d]
    layer = _top_energy_share(joint.T @ joint, layer_ranks, total.sum())
    return {
        "per_page": {str(r): (page_eig[:, :r].sum(-1) / total).tolist() for r in page_ranks},
        "shared": {str(r): shared[r].tolist() for r in shared_ranks},
        "shared_layer": {str(r): layer[r].item() for r in layer_ranks},
        "heads": h,
    }
