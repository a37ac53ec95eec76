"""Mixing matrices of decentralized SGD written out from their definitions (Ying et al.,
arXiv 2110.13363), with explicit loops and permutation matrices: the independent
expectations of the unit tests, never built with hvdx.core.mixing_graphs.

Convention: ``x_new[i] = sum_j W[i, j] x[j]`` (row i: what rank i receives). The
dynamic graphs are indexed by the mix ``m``, the number of mixes before this one
(:func:`mixes_before` counts them from a training step), not by the training step.
"""

import math

import numpy as np


def tau(n):
    return math.ceil(math.log2(n)) if n > 1 else 0


def mixes_before(t, mix_every):
    """How many of the training steps ``0 .. t-1`` mix: those with
    ``(s + 1) % mix_every == 0``, counted one by one."""
    return sum(1 for s in range(t) if (s + 1) % mix_every == 0)


def receive_from(n, d):
    """Permutation matrix of 'rank i receives from i - d': P[i, (i - d) % n] = 1."""
    p = np.zeros((n, n))
    for i in range(n):
        p[i, (i - d) % n] = 1.0
    return p


def explicit_static_exp(n):
    w = np.zeros((n, n))
    for i in range(n):
        w[i, i] += 1.0
        for k in range(tau(n)):
            w[i, (i - 2 ** k) % n] += 1.0  # receives from i - 2^k
    return w / (tau(n) + 1)


def explicit_one_peer_exp(n, m):
    """Mix ``m``: rank i sends to i + 2^(m mod tau), receives from i - 2^(m mod tau)."""
    if n == 1:
        return np.eye(1)
    w = np.zeros((n, n))
    for i in range(n):
        w[i, i] += 0.5
        w[i, (i - 2 ** (m % tau(n))) % n] += 0.5
    return w


def explicit_hypercube(n, m):
    if n == 1:
        return np.eye(1)
    w = np.zeros((n, n))
    for i in range(n):
        partner = i ^ (2 ** (m % tau(n)))
        if partner < n:
            w[i, i], w[i, partner] = 0.5, 0.5
        else:
            w[i, i] = 1.0  # no partner this step: keeps its value
    return w


def explicit_ring(n):
    """BlueFog's RingGraph: 1 and 2 ranks average; from 3 on, (I + S + S^T) / 3."""
    if n <= 2:
        return np.full((n, n), 1.0 / n)
    return (np.eye(n) + receive_from(n, 1) + receive_from(n, -1)) / 3.0


def explicit_torus(n):
    """A wrapped rows x cols grid; each rank weighs itself and its DISTINCT neighbours
    (up, down, left, right) alike, 1 / (distinct + 1)."""
    rows = 1
    for d in range(1, n + 1):
        if d * d <= n and n % d == 0:
            rows = d
    cols = n // rows
    w = np.zeros((n, n))
    for r in range(rows):
        for c in range(cols):
            i = r * cols + c
            around = {(rr % rows) * cols + cc % cols
                      for rr, cc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1))}
            around.discard(i)
            for j in around | {i}:
                w[i, j] = 1.0 / (len(around) + 1)
    return w


def explicit(graph, n, m=0):
    """The matrix of mix ``m`` (the static graphs ignore it)."""
    return {"static-exp": lambda: explicit_static_exp(n),
            "one-peer-exp": lambda: explicit_one_peer_exp(n, m),
            "one-peer-hypercube": lambda: explicit_hypercube(n, m),
            "ring": lambda: explicit_ring(n),
            "torus": lambda: explicit_torus(n),
            "complete": lambda: np.full((n, n), 1.0 / n)}[graph]()
