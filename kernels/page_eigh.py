"""page_eigh: eigendecomposition of a batch of 16x16 symmetric matrices (the pages' Gram matrices).

torch.linalg.eigh on CUDA reads cuSOLVER's error flags on the host: every call
waits for the GPU. Summarising the pages a decode step sealed would then stall
the pipeline (the scheduler's next batch waits for the current one's kernels)
every 16 tokens. This kernel needs no host round trip: cyclic
two-sided Jacobi in float64 (as accurate as the float64 eigh it replaces; the
Gram matrix squares the keys' condition number), one program per matrix.

A sweep is 15 rounds of 8 disjoint rotations (round-robin pairing: in round r,
15 pairs with r and i with (2r - i) mod 15), each round A <- J^T A J and
U <- U J with J holding all 8 rotations, as float64 tensor-core dots. Sweeps
stop when the off-diagonal mass is below 1e-15 of the matrix's norm (Jacobi
converges quadratically: ~5-7 sweeps at 16x16) or after MAX_SWEEPS.
Eigenvalues come out in descending order, eigenvectors as matching columns.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SIZE = 16
MAX_SWEEPS = 12
_TOL = 1e-15


@triton.jit
def jacobi_eigh(a, MAX_SWEEPS: tl.constexpr, TOL: tl.constexpr):
    """a [16, 16] float64 symmetric -> (eigenvalues [16], eigenvectors [16, 16] as columns), unordered."""
    i = tl.arange(0, 16)
    eye = i[:, None] == i[None, :]
    u = tl.where(eye, 1.0, 0.0).to(tl.float64)
    a = 0.5 * (a + tl.trans(a))
    norm2 = tl.sum(tl.sum(a * a, 1), 0)
    off2 = tl.sum(tl.sum(tl.where(eye, 0.0, a * a), 1), 0)
    sweep = 0
    while (sweep < MAX_SWEEPS) & (off2 > TOL * TOL * norm2):
        for r in range(15):
            # Exactly symmetric: both ends of a pair must compute the same rotation (the dots'
            # rounding leaves ~1e-16 |A| of asymmetry, as large as the null space's entries).
            a = 0.5 * (a + tl.trans(a))
            partner = tl.where(i == 15, r, tl.where(i == r, 15, (2 * r - i + 30) % 15))
            is_p = i < partner  # i is the pair's p (its partner the q)
            at_partner = i[None, :] == partner[:, None]
            diag = tl.sum(tl.where(eye, a, 0.0), 1)
            a_pq = tl.sum(tl.where(at_partner, a, 0.0), 1)  # a[i, partner(i)]
            d_partner = tl.sum(tl.where(at_partner, diag[None, :], 0.0), 1)
            a_pp = tl.where(is_p, diag, d_partner)
            a_qq = tl.where(is_p, d_partner, diag)
            # Golub & Van Loan's symmetric Schur rotation; pairs already orthogonal (or negligibly
            # coupled) get none.
            skip = tl.abs(a_pq) <= 1e-300 + 1e-18 * (tl.abs(a_pp) + tl.abs(a_qq))
            tau = (a_qq - a_pp) / (2.0 * tl.where(skip, 1.0, a_pq))
            t = tl.where(tau >= 0, 1.0, -1.0) / (tl.abs(tau) + tl.sqrt(1.0 + tau * tau))
            t = tl.where(skip, 0.0, t)
            c = 1.0 / tl.sqrt(1.0 + t * t)
            s = t * c
            # Column i of J: c at row i, and -s (i = p) or +s (i = q) at row partner(i).
            j = tl.where(eye, c[None, :], 0.0) + tl.where(tl.trans(at_partner), tl.where(is_p, -s, s)[None, :], 0.0)
            a = tl.dot(tl.trans(j), tl.dot(a, j))
            u = tl.dot(u, j)
        off2 = tl.sum(tl.sum(tl.where(eye, 0.0, a * a), 1), 0)
        sweep += 1
    return tl.sum(tl.where(eye, a, 0.0), 1), u


@triton.jit
def descending_position(lam):
    """Position of each of 16 eigenvalues in descending order (ties by index)."""
    i = tl.arange(0, 16)
    before = (lam[None, :] > lam[:, None]) | ((lam[None, :] == lam[:, None]) & (i[None, :] < i[:, None]))
    return tl.sum(before.to(tl.int32), 1)


@triton.jit
def _page_eigh_kernel(a_ptr, lam_ptr, u_ptr, MAX_SWEEPS: tl.constexpr, TOL: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, 16)
    lam, u = jacobi_eigh(tl.load(a_ptr + pid * 256 + i[:, None] * 16 + i[None, :]), MAX_SWEEPS, TOL)
    pos = descending_position(lam)
    tl.store(lam_ptr + pid * 16 + pos, lam)
    tl.store(u_ptr + pid * 256 + i[:, None] * 16 + pos[None, :], u)


def page_eigh_triton(gram: torch.Tensor):
    """gram [n, 16, 16] symmetric -> (eigenvalues [n, 16] descending, eigenvectors [n, 16, 16] as
    columns), float64, without a host sync."""
    if gram.dim() != 3 or gram.shape[1:] != (SIZE, SIZE):
        raise ValueError(f"gram must be [n, {SIZE}, {SIZE}], got {tuple(gram.shape)}")
    a = gram.to(torch.float64).contiguous()
    n = a.shape[0]
    lam = torch.empty(n, SIZE, dtype=torch.float64, device=a.device)
    u = torch.empty_like(a)
    if n:
        _page_eigh_kernel[(n,)](a, lam, u, MAX_SWEEPS=MAX_SWEEPS, TOL=_TOL, num_warps=1)
    return lam, u


def page_eigh_torch(gram: torch.Tensor):
    """Reference: torch.linalg.eigh in float64, reordered to descending eigenvalues."""
    lam, u = torch.linalg.eigh(gram.to(torch.float64))
    return lam.flip(-1), u.flip(-1)
