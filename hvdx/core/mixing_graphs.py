"""Mixing graphs of decentralized SGD, as pure functions of (topology, n, rank, step).

Ying, Yuan, Chen, Hu, Pan and Yin, "Exponential Graph is Provably Efficient for
Decentralized Deep Training", NeurIPS 2021, arXiv 2110.13363; the reference
implementation is BlueFog's ``topology_util.py`` (``ExponentialTwoGraph``,
``GetDynamicOnePeerSendRecvRanks``).

Convention: a mixing matrix ``W`` is ``n x n`` float64 and one mixing step is
``x_new[i] = sum_j W[i, j] x[j]``: rank ``i`` RECEIVES from ``j != i`` where
``W[i, j] != 0`` and SENDS to ``k != i`` where ``W[k, i] != 0``. With
``tau = ceil(log2 n)``:

1. ``static-exp``: ``i`` sends to ``i + 2^k mod n`` for ``k = 0 .. tau-1``; weight
   ``1/(tau+1)`` on itself and each in-neighbour; spectral gap ``2/(1+tau)`` for even n;
2. ``one-peer-exp``: at step ``t``, ``i`` sends to ``i + 2^(t mod tau)`` and receives from
   ``i - 2^(t mod tau)``, weights 1/2 and 1/2; for ``n = 2^k`` the product of ``tau``
   consecutive matrices is exactly ``11^T/n``;
3. ``one-peer-hypercube``: partner ``i XOR 2^(t mod tau)``, weights 1/2; a rank whose
   partner does not exist (``n`` not a power of two) keeps its value that step;
4. ``ring``: ``(I + S + S^T)/3``; ``torus``: ``rows x cols`` with ``rows`` the largest
   divisor of ``n`` not above ``sqrt n``, ``(I + up + down + left + right)/5`` (coinciding
   neighbours add up, so small dimensions stay doubly stochastic); ``complete``: ``1/n``;
5. a user's matrix, checked by :func:`check_mixing_matrix`.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Tuple

import numpy as np

__all__ = ["Neighbors", "TOPOLOGIES", "check_mixing_matrix", "is_exact", "mixing_matrix",
           "neighbors", "period", "spectral_gap", "topology_name"]

TOPOLOGIES = ("one-peer-exp", "static-exp", "one-peer-hypercube", "ring", "torus",
              "complete")


@dataclass(frozen=True)
class Neighbors:
    """One rank's part of a mixing step, ranks in ascending order."""

    send_to: Tuple[int, ...]
    recv_from: Tuple[int, ...]
    self_weight: float
    recv_weights: Tuple[float, ...]


def _tau(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


def _power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _check_n(n) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n={n!r} must be a number of ranks of at least 1")
    return int(n)


def _shift(n: int, d: int) -> np.ndarray:
    """Permutation matrix of 'receive from i - d': P[i, (i - d) % n] = 1."""
    p = np.zeros((n, n))
    p[np.arange(n), (np.arange(n) - d) % n] = 1.0
    return p


def check_mixing_matrix(w, n=None, name: str = "topology") -> np.ndarray:
    """A float64 copy of ``w`` if it is a doubly stochastic ``n x n`` matrix.

    Raises:
        ValueError: naming ``name`` and saying what is wrong.
    """
    try:
        m = np.array(w, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={w!r} is not a matrix of numbers") from None
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] == 0:
        raise ValueError(f"{name}: a mixing matrix must be square, got shape {m.shape}")
    size = m.shape[0]
    if n is not None and size != n:
        raise ValueError(f"{name}: a {size}x{size} matrix but the job has {n} ranks")
    if not np.all(np.isfinite(m)):
        raise ValueError(f"{name}: the mixing matrix holds NaN or infinite entries")
    if np.any(m < 0):
        i, j = np.argwhere(m < 0)[0]
        raise ValueError(f"{name}: entry [{i}, {j}] is {m[i, j]!r}; mixing weights must "
                         "be non-negative")
    tolerance = 1e-9 * max(1, size)
    for axis, what in ((1, "row"), (0, "column")):
        sums = m.sum(axis=axis)
        bad = np.flatnonzero(np.abs(sums - 1.0) > tolerance)
        if bad.size:
            raise ValueError(f"{name}: {what} {bad[0]} sums to {sums[bad[0]]!r}; a mixing "
                             "matrix must be doubly stochastic (every row and column "
                             "sums to 1)")
    return m


def mixing_matrix(topology, n: int, step: int = 0) -> np.ndarray:
    """The ``n x n`` mixing matrix of ``topology`` at ``step`` (module docstring)."""
    n = _check_n(n)
    if not isinstance(topology, str):
        return check_mixing_matrix(topology, n)
    tau = _tau(n)
    if topology == "complete":
        return np.full((n, n), 1.0 / n)
    if topology == "static-exp":
        w = np.eye(n)
        for k in range(tau):
            w += _shift(n, 2 ** k)
        return w / (tau + 1)
    if topology == "one-peer-exp":
        if n == 1:
            return np.eye(1)
        return 0.5 * (np.eye(n) + _shift(n, 2 ** (step % tau)))
    if topology == "one-peer-hypercube":
        w = np.zeros((n, n))
        if n == 1:
            return np.eye(1)
        bit = 2 ** (step % tau)
        for i in range(n):
            j = i ^ bit
            if j < n:
                w[i, i] += 0.5
                w[i, j] += 0.5
            else:
                w[i, i] = 1.0
        return w
    if topology == "ring":
        return (np.eye(n) + _shift(n, 1) + _shift(n, -1)) / 3.0
    if topology == "torus":
        rows = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
        cols = n // rows
        w = np.eye(n)
        for i in range(n):
            r, c = divmod(i, cols)
            for rr, cc in (((r - 1) % rows, c), ((r + 1) % rows, c),
                           (r, (c - 1) % cols), (r, (c + 1) % cols)):
                w[i, rr * cols + cc] += 1.0
        return w / 5.0
    raise ValueError(f"topology={topology!r} must be one of {TOPOLOGIES} or a mixing "
                     "matrix")


def neighbors(topology, n: int, rank: int, step: int = 0) -> Neighbors:
    """Rank ``rank``'s send-to and receive-from ranks and weights at ``step``.

    The one-peer graphs are computed directly (O(1)); the others from the matrix.
    """
    n = _check_n(n)
    if not 0 <= rank < n:
        raise ValueError(f"rank={rank!r} must be in [0, {n})")
    if n == 1:
        return Neighbors((), (), 1.0, ())
    named = topology if isinstance(topology, str) else None
    if named == "one-peer-exp":
        d = 2 ** (step % _tau(n))
        return Neighbors(((rank + d) % n,), ((rank - d) % n,), 0.5, (0.5,))
    if named == "one-peer-hypercube" and _power_of_two(n):
        j = rank ^ (2 ** (step % _tau(n)))
        return Neighbors((j,), (j,), 0.5, (0.5,))
    w = mixing_matrix(topology, n, step)
    recv = tuple(int(j) for j in np.flatnonzero(w[rank]) if j != rank)
    send = tuple(int(k) for k in np.flatnonzero(w[:, rank]) if k != rank)
    return Neighbors(send, recv, float(w[rank, rank]),
                     tuple(float(w[rank, j]) for j in recv))


def period(topology, n: int) -> int:
    """Steps before the sequence of matrices repeats."""
    n = _check_n(n)
    if isinstance(topology, str) and topology.startswith("one-peer") and n > 1:
        return _tau(n)
    return 1


def is_exact(topology, n: int) -> bool:
    """Whether ``period`` consecutive matrices multiply to exactly ``11^T/n``."""
    n = _check_n(n)
    named = isinstance(topology, str)
    if n == 1 or (named and topology == "complete"):
        return True
    if isinstance(topology, str) and topology.startswith("one-peer"):
        return _power_of_two(n)
    if isinstance(topology, str):
        return False
    w = check_mixing_matrix(topology, n)
    return bool(np.allclose(w, 1.0 / n, rtol=0, atol=1e-12))


def spectral_gap(w) -> float:
    """``1 - rho`` with ``rho = ||W - 11^T/n||_2``, the second largest singular value of a
    doubly stochastic ``W``."""
    m = np.asarray(w, dtype=np.float64)
    n = m.shape[0]
    if n == 1:
        return 1.0
    return float(1.0 - np.linalg.norm(m - 1.0 / n, 2))


def topology_name(topology) -> str:
    """A rank-independent name for the fingerprint."""
    if isinstance(topology, str):
        return topology
    m = np.ascontiguousarray(np.asarray(topology, dtype=np.float64))
    return f"matrix:{m.shape[0]}:{hashlib.sha1(m.tobytes()).hexdigest()[:12]}"
