"""Mixing graphs of decentralized SGD, as pure functions of (graph, n, rank, mix).

Ying, Yuan, Chen, Hu, Pan and Yin, "Exponential Graph is Provably Efficient for
Decentralized Deep Training", NeurIPS 2021, arXiv 2110.13363; the reference
implementation is BlueFog's ``bluefog/common/topology_util.py`` (``ExponentialTwoGraph``,
``GetDynamicOnePeerSendRecvRanks``, ``RingGraph``, ``MeshGrid2DGraph``).

Convention: a mixing matrix ``W`` is ``n x n`` float64 and one mixing step is
``x_new[i] = sum_j W[i, j] x[j]``: rank ``i`` RECEIVES from ``j != i`` where
``W[i, j] != 0`` and SENDS to ``k != i`` where ``W[k, i] != 0``.

The graphs are indexed by the MIX INDEX ``m``, the number of mixes before this one, not
by the training step: with ``mix_every=J`` only the training steps ``t`` with
``(t + 1) % J == 0`` mix, and the one at ``t`` is mix ``m = t // J`` (:func:`mix_index`).
Indexing by ``t`` would skip shifts whenever ``J`` and ``tau`` share a factor (4 ranks,
``J = 2``: ``t = 1, 3, 5, ...`` would all take shift 2, and rank 0 would only ever mix
with rank 2). ``m`` is a function of the training step counter, so a checkpoint that
holds the step resumes the same sequence.

With ``tau = ceil(log2 n)`` (0 for ``n = 1``), the named graphs are:

1. ``static-exp``: ``i`` sends to ``i + 2^k mod n`` for ``k = 0 .. tau-1`` and receives
   from ``i - 2^k mod n``; weight ``1/(tau+1)`` on itself and on each in-neighbour. Its
   spectral gap is ``2/(1+tau)`` for even ``n`` (0.2857 at 64 ranks), larger for odd ``n``;
2. ``one-peer-exp``: at mix ``m``, with ``k = m mod tau``, ``i`` sends to ``i + 2^k`` and
   receives from ``i - 2^k`` (mod ``n``), weights 1/2 and 1/2. For ``n = 2^p`` the
   product of ``tau`` consecutive matrices, from any mix, is exactly ``11^T/n``;
3. ``one-peer-hypercube``: partner ``i XOR 2^(m mod tau)``, weights 1/2 (one symmetric
   pairwise exchange per mix, also exact over ``tau`` mixes for ``n = 2^p``). A rank
   whose partner does not exist (``n`` not a power of two) keeps its value that mix;
4. ``ring``: ``(I + S + S^T)/3`` with ``S`` the cyclic shift, for ``n >= 3``; for
   ``n = 2`` the two neighbours are one rank, weighed once: ``[[1/2, 1/2], [1/2, 1/2]]``
   (BlueFog's ``RingGraph``);
5. ``torus``: the ranks on a ``rows x cols`` grid, row-major, with ``rows`` the largest
   divisor of ``n`` not above ``sqrt n``, wrapping around in both dimensions. Rank ``i``
   receives from its DISTINCT grid neighbours (up, down, left, right): a dimension of
   size 1 gives none, of size 2 one (up and down are the same rank), of 3 or more two.
   Every rank has the same number ``d`` of them, and every weight, its own included,
   is ``1/(d + 1)``. This is BlueFog's convention for distinct neighbours: its
   ``MeshGrid2DGraph`` (a grid WITHOUT wrap-around, so ranks on its edge have fewer
   neighbours) weighs an edge ``1/max(d_i + 1, d_j + 1)`` (Metropolis-Hastings) and
   gives the rank itself the rest, which is the uniform ``1/(d + 1)`` when every rank
   has ``d`` distinct neighbours, as here; the two grids are the same matrix when no
   dimension exceeds 2. Its ``RingGraph`` is the ``1 x n`` case, 2 ranks included. So
   a prime ``n`` (a ``1 x n`` grid) is the ring, 4 ranks (2 x 2) weigh 1/3 on the rank
   itself and on its row and column partners, and 64 ranks (8 x 8, ``d = 4``)
   ``(I + up + down + left + right)/5``, gap 0.117;
6. ``complete``: every entry ``1/n`` (the exact average in one step);
7. a user's matrix (anything :func:`check_mixing_matrix` accepts), the same at every mix.

For ``n = 1`` every graph is the identity. Every named graph is a sum of permutation
matrices divided by a common denominator: rank ``i``'s row lists its sources with
multiplicity (:func:`_sources`; only the hypercube's missing partners repeat a rank),
so :func:`mixing_matrix` and :func:`neighbors` compute each weight as the same
``count / denominator`` and agree bit for bit, and :func:`neighbors` needs no ``n x n``
matrix for a named graph.
"""

from __future__ import annotations

import functools
import hashlib
import math
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

from hvdx.core.validation import check_integer

__all__ = ["GRAPHS", "Neighbors", "check_mixing_matrix", "graph_name", "is_exact",
           "mix_index", "mixing_matrix", "neighbors", "period", "spectral_gap"]

#: The named graphs, in the order the documentation lists them.
GRAPHS = ("one-peer-exp", "static-exp", "one-peer-hypercube", "ring", "torus",
              "complete")

#: Graphs whose matrix depends on the mix index.
_DYNAMIC = ("one-peer-exp", "one-peer-hypercube")


@dataclass(frozen=True)
class Neighbors:
    """One rank's part of a mixing step, ranks in ascending order.

    Attributes:
        send_to: the ranks ``k != rank`` with ``W[k, rank] != 0``.
        recv_from: the ranks ``j != rank`` with ``W[rank, j] != 0``.
        self_weight: ``W[rank, rank]``.
        recv_weights: ``W[rank, j]`` for each ``j`` of ``recv_from``, in that order.
    """

    send_to: Tuple[int, ...]
    recv_from: Tuple[int, ...]
    self_weight: float
    recv_weights: Tuple[float, ...]


def _tau(n: int) -> int:
    """``ceil(log2 n)``, exactly (integer arithmetic), 0 for ``n = 1``."""
    return (n - 1).bit_length()


def _power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


@functools.lru_cache(maxsize=64)
def _torus_shape(n: int) -> Tuple[int, int]:
    """``(rows, cols)``: ``rows`` the largest divisor of ``n`` not above ``sqrt n``."""
    rows = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return rows, n // rows


def _check_n(n) -> int:
    return check_integer("n", n, 1)


def _name(graph) -> Optional[str]:
    """The graph's name, or None for a matrix; ValueError for an unknown name."""
    if isinstance(graph, str):
        if graph not in GRAPHS:
            raise ValueError(f"graph={graph!r} is not a known graph; use one of "
                             f"{', '.join(GRAPHS)}, or pass an n x n doubly stochastic "
                             "mixing matrix")
        return graph
    return None


def _offsets(size: int) -> Tuple[int, ...]:
    """The distinct neighbour offsets along a cyclic dimension of ``size`` ranks: none
    for 1, one for 2 (``-1`` and ``+1`` are the same rank, weighed once), two beyond."""
    return () if size == 1 else (1,) if size == 2 else (-1, 1)


def mix_index(step: int, mix_every: int = 1) -> int:
    """The graph index of training step ``step``: the number of mixes before it.

    1. with ``mix_every=J`` the training steps ``t`` with ``(t + 1) % J == 0`` mix;
    2. those before ``step`` are ``t = J - 1, 2J - 1, ...`` below ``step``: ``step // J``
       of them;
    3. so the mix at a mixing step ``t`` is mix number ``t // J = (t + 1) // J - 1``, and
       consecutive mixes take consecutive graphs whatever ``J`` is.

    A ``global_every`` step that replaces a mix still counts: the index depends on the
    step counter alone, which every checkpoint holds.

    Raises:
        ValueError: a negative ``step`` or a ``mix_every`` below 1.
    """
    return check_integer("step", step, 0) // check_integer("mix_every", mix_every, 1)


def _sources(name: str, n: int, i, step: int) -> Tuple[List[np.ndarray], int]:
    """Row ``i`` of a named graph (``i`` an int array): the columns of its non-zero
    entries, one array per permutation matrix of the sum (so with multiplicity, the
    rank itself included), and the common denominator: ``W[i, j] = count(j) / den``;
    ``step`` is the mix index (:func:`mix_index`)."""
    if n == 1:
        return [i], 1
    tau = _tau(n)
    if name == "static-exp":
        return [i] + [(i - 2 ** k) % n for k in range(tau)], tau + 1
    if name == "one-peer-exp":
        return [i, (i - 2 ** (step % tau)) % n], 2
    if name == "one-peer-hypercube":
        partner = i ^ 2 ** (step % tau)
        return [i, np.where(partner < n, partner, i)], 2
    if name in ("ring", "torus"):
        rows, cols = (1, n) if name == "ring" else _torus_shape(n)
        r, c = np.divmod(i, cols)
        sources = [i] + [(r + d) % rows * cols + c for d in _offsets(rows)] + \
            [r * cols + (c + d) % cols for d in _offsets(cols)]
        return sources, len(sources)
    assert name == "complete", name
    return [np.full_like(i, j) for j in range(n)], n


def _targets(name: str, n: int, rank: int, step: int) -> Tuple[int, ...]:
    """The ranks ``k != rank`` that receive from ``rank`` (column ``rank`` of W), sorted."""
    if n == 1:
        return ()
    if name == "static-exp":
        out = {(rank + 2 ** k) % n for k in range(_tau(n))}
    elif name == "one-peer-exp":
        out = {(rank + 2 ** (step % _tau(n))) % n}
    else:  # ring, torus, hypercube, complete: W is symmetric
        out = {int(j[0]) for j in _sources(name, n, np.array([rank]), step)[0]}
    return tuple(sorted(out - {rank}))


def check_mixing_matrix(w, n=None, name: str = "graph") -> np.ndarray:
    """A float64 copy of ``w`` if it is a doubly stochastic ``n x n`` mixing matrix.

    Checks, in order: a 2-D square non-empty array of numbers; ``n x n`` when ``n`` is
    given; finite; non-negative; every row and every column summing to 1 within
    ``1e-9 * n`` (build the matrix in float64: float32 thirds sum to ``1 + 3e-8``).

    Args:
        w: the matrix (array-like).
        n: the number of ranks of the job; None: any size.
        name: the argument's name, for the error message.

    Returns:
        ``w`` as a new float64 array.

    Raises:
        ValueError: naming ``name`` and saying what is wrong, e.g. ``"graph: row 2
            sums to 0.9; a mixing matrix must be doubly stochastic (every row and column
            sums to 1)"``.
    """
    try:
        m = np.array(w, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={w!r} is not a matrix of numbers; pass an n x n doubly "
                         "stochastic mixing matrix (n the number of ranks)") from None
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] == 0:
        raise ValueError(f"{name}: a mixing matrix must be square (n x n, n the number of "
                         f"ranks), got shape {m.shape}")
    size = m.shape[0]
    if n is not None and size != _check_n(n):
        raise ValueError(f"{name}: a {size}x{size} matrix but the job has {n} ranks; pass "
                         f"a {n}x{n} matrix")
    if not np.all(np.isfinite(m)):
        i, j = np.argwhere(~np.isfinite(m))[0]
        raise ValueError(f"{name}: entry [{i}, {j}] is {float(m[i, j])!r}; a mixing matrix "
                         "must hold finite numbers (no NaN or infinity)")
    if np.any(m < 0):
        i, j = np.argwhere(m < 0)[0]
        raise ValueError(f"{name}: entry [{i}, {j}] is {float(m[i, j])!r}; mixing weights "
                         "must be non-negative")
    tolerance = 1e-9 * size
    for axis, what in ((1, "row"), (0, "column")):
        sums = m.sum(axis=axis)
        bad = np.flatnonzero(np.abs(sums - 1.0) > tolerance)
        if bad.size:
            raise ValueError(f"{name}: {what} {bad[0]} sums to {float(sums[bad[0]]):.12g}; "
                             "a mixing matrix must be doubly stochastic (every row and "
                             "column sums to 1)")
    return m


def mixing_matrix(graph, n: int, step: int = 0) -> np.ndarray:
    """The ``n x n`` float64 mixing matrix of ``graph`` at mix ``step``.

    Args:
        graph: a name of :data:`GRAPHS` (module docstring) or a mixing matrix.
        n: number of ranks, at least 1.
        step: the mix index ``m``, at least 0: the number of mixes before this one
            (:func:`mix_index` of the training step); only the one-peer graphs depend
            on it.

    Returns:
        A new array ``W``: one mixing step is ``x_new[i] = sum_j W[i, j] x[j]``.

    Raises:
        ValueError: an unknown name (the accepted ones listed), a bad ``n`` or ``step``,
            or a matrix :func:`check_mixing_matrix` refuses.
    """
    n = _check_n(n)
    step = check_integer("step", step, 0)
    name = _name(graph)
    if name is None:
        return check_mixing_matrix(graph, n)
    if name == "complete":
        return np.full((n, n), 1.0 / n)
    rows = np.arange(n)
    sources, denominator = _sources(name, n, rows, step)
    w = np.zeros((n, n))
    for columns in sources:
        np.add.at(w, (rows, columns), 1.0)
    return w / denominator


def neighbors(graph, n: int, rank: int, step: int = 0) -> Neighbors:
    """Rank ``rank``'s send-to and receive-from ranks and weights at mix ``step``.

    A named graph is computed from its definition, in ``O(degree)`` for all but
    ``complete`` and ``torus`` (``O(n)`` and ``O(sqrt n)``); a matrix from its row and
    column. The result agrees exactly with :func:`mixing_matrix`.

    Args:
        graph: a name of :data:`GRAPHS` or a mixing matrix.
        n: number of ranks, at least 1.
        rank: this rank, ``0 .. n-1``.
        step: the mix index, at least 0 (:func:`mixing_matrix`).

    Raises:
        ValueError: as :func:`mixing_matrix`, or a ``rank`` outside ``0 .. n-1``.
    """
    n = _check_n(n)
    rank = check_integer("rank", rank, 0, n - 1)
    step = check_integer("step", step, 0)
    name = _name(graph)
    if name is None:
        w = check_mixing_matrix(graph, n)
        recv = tuple(int(j) for j in np.flatnonzero(w[rank]) if j != rank)
        send = tuple(int(k) for k in np.flatnonzero(w[:, rank]) if k != rank)
        return Neighbors(send, recv, float(w[rank, rank]),
                         tuple(float(w[rank, j]) for j in recv))
    sources, denominator = _sources(name, n, np.array([rank]), step)
    counts = Counter(int(j[0]) for j in sources)
    recv = tuple(sorted(j for j in counts if j != rank))
    # The same float64 division as mixing_matrix's ``w / denominator``.
    weight = [float(np.float64(counts[j]) / denominator) for j in (rank,) + recv]
    return Neighbors(_targets(name, n, rank, step), recv, weight[0], tuple(weight[1:]))


def period(graph, n: int) -> int:
    """The number of distinct mixes before the sequence of matrices repeats.

    ``tau = ceil(log2 n)`` for the one-peer graphs with ``n > 1``, else 1 (a static graph
    or a user's matrix).
    """
    n = _check_n(n)
    name = _name(graph)
    if name is None:
        check_mixing_matrix(graph, n)
        return 1
    return _tau(n) if name in _DYNAMIC and n > 1 else 1


def is_exact(graph, n: int) -> bool:
    """Whether ``period`` consecutive matrices multiply to ``11^T/n`` (exact averaging).

    True for ``n = 1``; ``complete``; the one-peer graphs when ``n`` is a power of two
    (Ying et al.); and the small cases where a static graph is already the
    complete one: ``static-exp`` on 2 or 3 ranks (its ``tau + 1`` shifts are all of
    ``0 .. n-1``), ``ring`` and ``torus`` on 2 or 3 (every other rank a distinct
    neighbour). A user's matrix: whether it is ``11^T/n`` within ``1e-12``.
    """
    n = _check_n(n)
    name = _name(graph)
    if name is None:
        w = check_mixing_matrix(graph, n)
        return bool(np.allclose(w, 1.0 / n, rtol=0, atol=1e-12))
    if n == 1 or name == "complete":
        return True
    if name in _DYNAMIC:
        return _power_of_two(n)
    # static-exp, ring, torus: one matrix, exact only if it is 11^T/n, i.e. every other
    # rank is a distinct in-neighbour. The torus has at most 4 of them, and from 4 ranks
    # on its grid leaves some out (2 x 2: the diagonal; 1 x 5: the ring).
    return n <= 3


def spectral_gap(w) -> float:
    """``1 - rho``, ``rho`` the second largest singular value of a mixing matrix ``W``.

    For a doubly stochastic ``W`` the largest singular value is 1 (on the all-ones
    vector), so ``rho = ||W - 11^T/n||_2``, the rate at which one step contracts the
    distance to consensus. 1 for ``n = 1`` and for the complete graph.

    Raises:
        ValueError: naming ``w`` when :func:`check_mixing_matrix` refuses it.
    """
    m = check_mixing_matrix(w, name="w")
    n = m.shape[0]
    if n == 1:
        return 1.0
    return float(1.0 - np.linalg.norm(m - 1.0 / n, 2))


def graph_name(graph) -> str:
    """A rank-independent name for the cross-rank fingerprint.

    The graph's name, or ``"matrix:<12 hex digits>"``: the start of the SHA-1 of the
    matrix's float64 bytes (C order), so ranks that hold different matrices differ.
    """
    name = _name(graph)
    if name is not None:
        return name
    m = np.ascontiguousarray(check_mixing_matrix(graph))
    return f"matrix:{hashlib.sha1(m.tobytes()).hexdigest()[:12]}"


#: The old names of this module's graph names (``topology`` now means the racks only,
#: :mod:`hvdx.core.topology`): still importable, with a ``DeprecationWarning``.
_OLD_NAMES = {"TOPOLOGIES": "GRAPHS", "topology_name": "graph_name"}


def __getattr__(name: str):
    if name in _OLD_NAMES:
        new = _OLD_NAMES[name]
        warnings.warn(f"hvdx.core.mixing_graphs.{name} is deprecated; use {new} (the "
                      "word 'topology' now means the racks only)", DeprecationWarning,
                      stacklevel=2)
        return globals()[new]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
