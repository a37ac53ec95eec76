"""Mixing matrices of decentralized SGD written out from their definitions (Ying et al.,
arXiv 2110.13363), with explicit loops and permutation matrices: the independent
expectations of the unit tests, never built with hvdx.core.mixing_graphs.

Convention: ``x_new[i] = sum_j W[i, j] x[j]`` (row i: what rank i receives).
"""

import math

import numpy as np


def tau(n):
    return math.ceil(math.log2(n)) if n > 1 else 0


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


def explicit_one_peer_exp(n, step):
    if n == 1:
        return np.eye(1)
    w = np.zeros((n, n))
    for i in range(n):
        w[i, i] += 0.5
        w[i, (i - 2 ** (step % tau(n))) % n] += 0.5
    return w


def explicit_hypercube(n, step):
    if n == 1:
        return np.eye(1)
    w = np.zeros((n, n))
    for i in range(n):
        partner = i ^ (2 ** (step % tau(n)))
        if partner < n:
            w[i, i], w[i, partner] = 0.5, 0.5
        else:
            w[i, i] = 1.0  # no partner this step: keeps its value
    return w


def explicit_ring(n):
    return (np.eye(n) + receive_from(n, 1) + receive_from(n, -1)) / 3.0


def explicit_torus(n):
    rows = 1
    for d in range(1, n + 1):
        if d * d <= n and n % d == 0:
            rows = d
    cols = n // rows
    w = np.zeros((n, n))
    for r in range(rows):
        for c in range(cols):
            i = r * cols + c
            w[i, i] += 1.0
            for rr, cc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
                w[i, (rr % rows) * cols + cc % cols] += 1.0
    return w / 5.0


def explicit(topology, n, step=0):
    return {"static-exp": lambda: explicit_static_exp(n),
            "one-peer-exp": lambda: explicit_one_peer_exp(n, step),
            "one-peer-hypercube": lambda: explicit_hypercube(n, step),
            "ring": lambda: explicit_ring(n),
            "torus": lambda: explicit_torus(n),
            "complete": lambda: np.full((n, n), 1.0 / n)}[topology]()
