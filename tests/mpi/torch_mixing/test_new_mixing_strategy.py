"""A new built-in mixing strategy is its folder and one catalogue line: the complete
example of docs/design.md (a ring, tests/mpi/ring_strategy.py) trains under torch's
``DistributedOptimizer`` through the shared mixing driver, with no adapter of its own.

Checked against a few lines of numpy that simulate every rank with the ring's matrix
written out here: quadratic losses ``0.5 ||x - c_r||^2`` (gradient ``x - c_r``), plain
SGD, then ``x_i <- mean(x_{i-1}, x_i, x_{i+1})`` (on two ranks, the mean of both; on one,
nothing), every ``global_every``-th step the mean over all ranks. Also: ``HVDX_SYNC``
builds it by its constructor's name, and its step counter is in ``state_dict()`` under
its key.
"""

import pathlib
import sys

import numpy as np
import pytest
import torch

import hvdx.torch as hvd

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import ring_strategy  # noqa: E402
from ring_catalogue import add_the_ring, ring_matrix  # noqa: E402
from hvdx_variables import hvdx_variables  # noqa: E402

SHAPES = [(3,), (2, 2)]
LR = 0.1


@pytest.fixture
def ring_in_the_catalogue(monkeypatch):
    add_the_ring(monkeypatch)


def targets(rank):
    return [np.arange(np.prod(s), dtype=np.float64).reshape(s) + 3.0 * rank - k
            for k, s in enumerate(SHAPES)]


def reference(steps, n, global_every=0):
    """Every rank's parameters after ``steps`` steps (float64)."""
    x = [[np.ones(s) for s in SHAPES] for _ in range(n)]
    for t in range(steps):
        x = [[p - LR * (p - c) for p, c in zip(x[r], targets(r))] for r in range(n)]
        w = np.full((n, n), 1.0 / n) if global_every and (t + 1) % global_every == 0 \
            else ring_matrix(n)
        x = [[sum(w[i, j] * x[j][k] for j in range(n)) for k in range(len(SHAPES))]
             for i in range(n)]
    return x


def build(sync=None):
    params = [torch.nn.Parameter(torch.ones(s)) for s in SHAPES]
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(params, lr=LR), named_parameters=[(f"p{k}", p) for k, p in
                                                          enumerate(params)],
        **({} if sync is None else {"sync": sync}))
    return optimizer, params


def train(optimizer, params, steps):
    c = [torch.tensor(t, dtype=torch.float32) for t in targets(hvd.rank())]
    for _ in range(steps):
        optimizer.zero_grad()
        sum(0.5 * ((p - t) ** 2).sum() for p, t in zip(params, c)).backward()
        optimizer.step()
    return [p.detach().numpy().astype(np.float64) for p in params]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("global_every", [0, 3])
def test_the_example_ring_trains_as_the_numpy_reference(ring_in_the_catalogue,
                                                        global_every):
    optimizer, params = build(ring_strategy.Ring(global_every=global_every))
    got = train(optimizer, params, 5)
    expected = reference(5, hvd.size(), global_every)[hvd.rank()]
    assert all(np.allclose(g, e, rtol=1e-5, atol=1e-6) for g, e in zip(got, expected))
    assert optimizer.state_dict()["hvdx_ring"]["step"] == 5
    assert optimizer.hvdx_stats.steps == 5


@pytest.mark.mpi(min_size=1)
def test_hvdx_sync_builds_the_example_by_its_constructor(ring_in_the_catalogue):
    with hvdx_variables(sync="Ring(global_every=2)"):
        optimizer, params = build()
        assert isinstance(optimizer.hvdx_strategy, ring_strategy.Ring)
        got = train(optimizer, params, 4)
    expected = reference(4, hvd.size(), 2)[hvd.rank()]
    assert all(np.allclose(g, e, rtol=1e-5, atol=1e-6) for g, e in zip(got, expected))


@pytest.mark.mpi(min_size=1)
def test_the_example_resumes_its_schedule_from_a_checkpoint(ring_in_the_catalogue):
    optimizer, params = build(ring_strategy.Ring(global_every=3))
    train(optimizer, params, 2)
    saved = optimizer.state_dict()
    resumed, resumed_params = build(ring_strategy.Ring(global_every=3))
    with torch.no_grad():
        for p, q in zip(resumed_params, params):
            p.copy_(q)
    resumed.load_state_dict(saved)
    got = train(resumed, resumed_params, 3)
    expected = reference(5, hvd.size(), 3)[hvd.rank()]
    assert all(np.allclose(g, e, rtol=1e-5, atol=1e-6) for g, e in zip(got, expected))
