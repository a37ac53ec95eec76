"""The built-in low-precision compressions, ``hvd.Compression.int8`` and
``hvd.Compression.sign``, run by ``hvd.DistributedOptimizer`` on a small model.

Every rank's batch comes from a generator seeded with its rank and the step, so each
rank computes every rank's local gradient from the current parameters, and the test
simulates the job's step in numpy (each rank's error feedback, the average over the
ranks) with the algorithms written out here.
"""

import io
import pathlib
import sys

import numpy as np
import pytest
import torch

import hvdx.torch as hvd
from hvdx.strategies.low_precision.spec import Int8Compression, SignCompression

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from low_precision_reference import int8_round_trip, sign_round_trip  # noqa: E402
from hvdx_variables import hvdx_variables  # noqa: E402

pytestmark = [pytest.mark.up_to_two_ranks("the compressors against their numpy reference"),
              pytest.mark.int8, pytest.mark.sign, pytest.mark.user_compression]

LR = 0.1


CASES = [(lambda: hvd.Compression.int8(chunk=4), int8_round_trip, Int8Compression),
         (lambda: hvd.Compression.sign(), sign_round_trip, SignCompression)]
IDS = ["int8", "sign"]


def batch(rank, step):
    rng = np.random.default_rng([rank, step])
    return (torch.from_numpy(rng.standard_normal((6, 4)).astype(np.float32)),
            torch.from_numpy(rng.standard_normal((6, 3)).astype(np.float32)))


def loss_of(weight, bias, rank, step):
    x, y = batch(rank, step)
    return ((torch.nn.functional.linear(x, weight, bias) - y) ** 2).mean()


def model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3)


def make(net, **arguments):
    return hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=LR),
                                    named_parameters=list(net.named_parameters()),
                                    **arguments)


def local_gradients(net, rank, step):
    """Rank ``rank``'s gradient at ``net``'s parameters, by name."""
    leaves = {n: p.detach().clone().requires_grad_() for n, p in net.named_parameters()}
    grads = torch.autograd.grad(loss_of(leaves["weight"], leaves["bias"], rank, step),
                                list(leaves.values()))
    return {n: g.numpy() for n, g in zip(leaves, grads)}


def train(net, optimizer, steps, first=0, round_trip=None, residuals=None):
    """``steps`` steps of the job; with ``round_trip``, each step's averaged gradient
    is checked against the numpy simulation, which carries ``residuals``."""
    for step in range(first, first + steps):
        expected = None
        if round_trip is not None:
            every = [local_gradients(net, r, step) for r in range(hvd.size())]
            expected = {}
            for n in every[0]:
                decoded = []
                for r in range(hvd.size()):
                    corrected = every[r][n] + residuals[r].get(n, np.float32(0))
                    decoded.append(round_trip(corrected))
                    residuals[r][n] = corrected - decoded[-1]
                total = decoded[0].copy()
                for d in decoded[1:]:
                    total = total + d
                expected[n] = total / np.float32(hvd.size())
        optimizer.zero_grad()
        loss_of(net.weight, net.bias, hvd.rank(), step).backward()
        optimizer.step()
        if expected is not None:
            for n, p in net.named_parameters():
                np.testing.assert_allclose(p.grad.numpy(), expected[n], rtol=1e-5,
                                           atol=1e-7)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("build, round_trip, kind", CASES, ids=IDS)
def test_three_steps_average_the_numpy_simulation_of_every_rank(build, round_trip, kind):
    net = model()
    optimizer = make(net, compression=build())
    assert type(optimizer.hvdx_strategy) is kind
    residuals = [{} for _ in range(hvd.size())]
    train(net, optimizer, 3, round_trip=round_trip, residuals=residuals)
    saved = optimizer.state_dict()["hvdx_user_compression"]
    assert saved["step"] == 3
    for n in residuals[hvd.rank()]:
        np.testing.assert_allclose(saved["residuals"][n].numpy(), residuals[hvd.rank()][n],
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("build, round_trip, kind", CASES, ids=IDS)
def test_a_state_dict_round_trip_resumes_bitwise(build, round_trip, kind):
    net = model()
    optimizer = make(net, compression=build())
    train(net, optimizer, 2)
    buffer = io.BytesIO()
    torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    train(net, optimizer, 1, first=2)

    buffer.seek(0)
    saved = torch.load(buffer)
    resumed = model()
    resumed.load_state_dict(saved["model"])
    again = make(resumed, compression=build())
    again.load_state_dict(saved["optimizer"])
    train(resumed, again, 1, first=2)
    for a, b in zip(net.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    ours, theirs = (o.state_dict()["hvdx_user_compression"] for o in (optimizer, again))
    assert ours["step"] == theirs["step"] == 3
    for n in ours["residuals"]:
        assert torch.equal(ours["residuals"][n], theirs["residuals"][n])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("value, build", [
    ("int8(chunk=4)", lambda: hvd.Compression.int8(chunk=4)),
    ("sign", lambda: hvd.Compression.sign()),
])
def test_hvdx_compression_picks_them(value, build):
    in_code = model()
    train(in_code, make(in_code, compression=build()), 3)
    chosen = model()
    with hvdx_variables(compression=value):
        optimizer = make(chosen)
        assert optimizer.hvdx_strategy.describe() == build().describe()
        train(chosen, optimizer, 3)
    for a, b in zip(in_code.parameters(), chosen.parameters()):
        assert torch.equal(a, b)
