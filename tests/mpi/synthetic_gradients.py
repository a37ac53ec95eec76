"""The per-rank gradients the TopK tests feed both adapters (torch and TensorFlow), so
that both are checked against the numpy reference on the same inputs."""

import numpy as np


def grads_of_all_ranks(size, step, d, seed=0):
    """Every rank's gradient at ``step``; all ranks can compute all of them.

    Magnitudes spread over four orders (log-uniform scale per entry, the same on every
    rank), as real gradients do, so TopK's choice is not a coin toss.
    """
    out = []
    for r in range(size):
        rng = np.random.default_rng([seed, step, r])
        scale = np.exp(np.random.default_rng([seed]).uniform(-3, 1, d))
        out.append((rng.standard_normal(d) * scale).astype(np.float32))
    return out
