"""A compressor defined here, registered, and run by ``hvd.DistributedOptimizer``.

Every rank's gradients come from seeded generators, so the test computes the whole
job's training in numpy (every rank's residuals, the average over ranks) and compares.
"""

import io
import pathlib
import sys
import zlib

import numpy as np
import pytest
import torch

import hvdx
import hvdx.torch as hvd
from hvdx.compression_registry import UserCompression
from hvdx.core.user_compression import Compressor

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from hvdx_variables import hvdx_variables  # noqa: E402


# The protocol's steps, checkpoints and Horovod's join do not depend on the size past two
# ranks (tests/conftest.py).
pytestmark = [pytest.mark.up_to_two_ranks('a registered compressor against its numpy reference'),
              pytest.mark.user_compression, pytest.mark.sign]


class ScaledSign(Compressor):
    def __init__(self, scale=1.0):
        if not scale > 0:
            raise ValueError(f"scale={scale!r} must be positive")
        self.scale = scale

    def compress(self, x, step, name):
        return [np.signbit(x), np.array(np.abs(x).mean(), x.dtype)]

    def decompress(self, payloads, shape, dtype, step, name):
        negative, mean = payloads
        sign = np.where(negative, -1.0, 1.0).astype(dtype)
        return sign * (mean * dtype.type(self.scale))

    def settings(self):
        return {"scale": self.scale}


class RandomK(Compressor):
    """k entries chosen by a generator seeded with (seed, step, name): every rank picks
    the same entries, and decompress finds them again without receiving them."""

    def __init__(self, k=3, seed=0):
        self.k, self.seed = k, seed

    def _indices(self, size, step, name):
        rng = np.random.default_rng([self.seed, step, zlib.crc32(name.encode())])
        return rng.choice(size, min(self.k, size), replace=False)

    def compress(self, x, step, name):
        return [x.reshape(-1)[self._indices(x.size, step, name)]]

    def decompress(self, payloads, shape, dtype, step, name):
        out = np.zeros(int(np.prod(shape)), dtype)
        out[self._indices(out.size, step, name)] = payloads[0]
        return out.reshape(shape)

    def settings(self):
        return {"k": self.k, "seed": self.seed}


class Identity(Compressor):
    def compress(self, x, step, name):
        return [x]

    def decompress(self, payloads, shape, dtype, step, name):
        return payloads[0]


class SummedRandomK(RandomK):
    """The same random-k through the "allreduce" communicator: every rank's payload
    holds the same entries, so the payloads add up where they lie."""

    communicator = "allreduce"


class ForgetfulRandomK(RandomK):
    """The same random-k with the memory "none": what it leaves out is lost."""

    memory = "none"


class RankShaped(Compressor):
    """Payloads whose length depends on the rank: the "allreduce" communicator must
    refuse them on every rank."""

    communicator = "allreduce"

    def compress(self, x, step, name):
        return [x.reshape(-1)[:1 + hvd.rank()]]

    def decompress(self, payloads, shape, dtype, step, name):
        return np.zeros(shape, dtype)


hvdx.register_compressor("test_scaled_sign", ScaledSign)
hvdx.register_compressor("test_summed_random_k", SummedRandomK)
hvdx.register_compressor("test_forgetful_random_k", ForgetfulRandomK)
hvdx.register_compressor("test_rank_shaped", RankShaped)
hvdx.register_compressor("test_random_k", RandomK)
hvdx.register_compressor("test_identity", Identity)

SHAPES = {"w": (4, 3), "b": (3,)}
LR = np.float32(0.1)


def gradient(rank, step, name):
    rng = np.random.default_rng([rank, step, len(name), SHAPES[name][0]])
    return rng.standard_normal(SHAPES[name]).astype(np.float32)


def start():
    return {n: np.linspace(-1, 1, int(np.prod(s)), dtype=np.float32).reshape(s)
            for n, s in SHAPES.items()}


def reference(compressor, steps, first=0, residuals=None):
    """Parameters after ``steps`` steps of SGD on the compressed average, and every
    rank's residuals, computed here for the whole job."""
    size = hvd.size()
    params = start() if first == 0 else None
    residuals = residuals or [{n: np.zeros(s, np.float32) for n, s in SHAPES.items()}
                              for _ in range(size)]
    history = []
    for step in range(first, first + steps):
        average = {}
        for n, shape in SHAPES.items():
            decoded = []
            for r in range(size):
                corrected = gradient(r, step, n) + residuals[r][n]
                mine = compressor.decompress(compressor.compress(corrected, step, n), shape,
                                             np.dtype(np.float32), step, n)
                residuals[r][n] = corrected - mine
                decoded.append(mine)
            total = decoded[0].copy()
            for d in decoded[1:]:
                total = total + d
            average[n] = total / np.float32(size)
        history.append(average)
    return history, residuals


def model():
    parameters = {n: torch.nn.Parameter(torch.from_numpy(v.copy()))
                  for n, v in start().items()}
    return parameters


def make(parameters, **arguments):
    return hvd.DistributedOptimizer(torch.optim.SGD(list(parameters.values()), lr=float(LR)),
                                    named_parameters=list(parameters.items()), **arguments)


def train(optimizer, parameters, steps, first=0):
    for step in range(first, first + steps):
        optimizer.zero_grad()
        for n, p in parameters.items():
            p.grad = torch.from_numpy(gradient(hvd.rank(), step, n))
        optimizer.step()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("compressor, build", [
    (ScaledSign(0.5), lambda: hvd.Compression.test_scaled_sign(scale=0.5)),
    (RandomK(5, seed=7), lambda: hvd.Compression.test_random_k(5, seed=7)),
])
def test_training_is_the_numpy_reference(compressor, build):
    parameters = model()
    optimizer = make(parameters, compression=build())
    assert isinstance(optimizer, torch.optim.SGD)
    assert isinstance(optimizer.hvdx_strategy, UserCompression)
    train(optimizer, parameters, 4)
    history, residuals = reference(compressor, 4)
    expected = start()
    for average in history:
        for n in SHAPES:
            expected[n] = expected[n] - LR * average[n]
    for n, p in parameters.items():
        np.testing.assert_allclose(p.detach().numpy(), expected[n], rtol=1e-5, atol=1e-6)
    saved = optimizer.state_dict()["hvdx_user_compression"]
    assert saved["step"] == 4
    for n in SHAPES:
        np.testing.assert_allclose(saved["residuals"][n].numpy(), residuals[hvd.rank()][n],
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.mpi(min_size=1)
def test_the_identity_compressor_trains_as_horovod():
    ours, theirs = model(), model()
    train(make(ours, compression=hvd.Compression.test_identity()), ours, 3)
    train(make(theirs), theirs, 3)
    for n in SHAPES:
        np.testing.assert_allclose(ours[n].detach().numpy(), theirs[n].detach().numpy(),
                                   rtol=1e-6, atol=1e-7)


@pytest.mark.mpi(min_size=1)
def test_a_checkpoint_resumes_bitwise():
    parameters = model()
    optimizer = make(parameters, compression=hvd.Compression.test_random_k(4, seed=3))
    train(optimizer, parameters, 2)
    buffer = io.BytesIO()
    torch.save({"model": {n: p.detach().clone() for n, p in parameters.items()},
                "optimizer": optimizer.state_dict()}, buffer)
    train(optimizer, parameters, 3, first=2)

    buffer.seek(0)
    saved = torch.load(buffer)
    resumed = model()
    with torch.no_grad():
        for n, p in resumed.items():
            p.copy_(saved["model"][n])
    again = make(resumed, compression=hvd.Compression.test_random_k(4, seed=3))
    again.load_state_dict(saved["optimizer"])
    train(again, resumed, 3, first=2)
    for n in SHAPES:
        assert torch.equal(parameters[n], resumed[n])
    a, b = optimizer.state_dict(), again.state_dict()
    assert a["hvdx_user_compression"]["step"] == b["hvdx_user_compression"]["step"] == 5
    for n in SHAPES:
        assert torch.equal(a["hvdx_user_compression"]["residuals"][n],
                           b["hvdx_user_compression"]["residuals"][n])


@pytest.mark.mpi(min_size=1)
def test_a_non_finite_gradient_on_one_rank_makes_every_gradient_nan():
    parameters = model()
    optimizer = make(parameters, compression=hvd.Compression.test_scaled_sign())
    train(optimizer, parameters, 1)
    before = optimizer.state_dict()["hvdx_user_compression"]
    for n, p in parameters.items():
        p.grad = torch.from_numpy(gradient(hvd.rank(), 1, n))
    if hvd.rank() == hvd.size() - 1:
        parameters["b"].grad[1] = float("inf")
    optimizer.synchronize()
    for p in parameters.values():
        assert torch.isnan(p.grad).all()
    after = optimizer.state_dict()["hvdx_user_compression"]
    assert after["step"] == before["step"] == 1
    for n in SHAPES:
        assert torch.equal(after["residuals"][n], before["residuals"][n])


@pytest.mark.mpi(min_size=1)
def test_hvdx_compression_picks_the_registered_compressor():
    in_code = model()
    train(make(in_code, compression=hvd.Compression.test_scaled_sign(0.5)), in_code, 3)
    chosen = model()
    with hvdx_variables(compression="test_scaled_sign(scale=0.5)"):
        optimizer = make(chosen)
        assert isinstance(optimizer.hvdx_strategy, UserCompression)
        assert optimizer.hvdx_strategy.compressor.scale == 0.5
        train(optimizer, chosen, 3)
    for n in SHAPES:
        assert torch.equal(in_code[n], chosen[n])


def refused_everywhere(build, name):
    with pytest.raises(ValueError) as info:
        make(model(), compression=build())
    message = str(info.value)
    assert len(set(hvd.allgather_object(message))) == 1
    total = hvd.allreduce(torch.ones(2), op=hvd.Sum, name=f"after.{name}")
    assert torch.equal(total, torch.full((2,), float(hvd.size())))
    return message


@pytest.mark.mpi(min_size=2)
def test_another_setting_on_one_rank_fails_on_every_rank():
    last = hvd.rank() == hvd.size() - 1
    message = refused_everywhere(
        lambda: hvd.Compression.test_random_k(3, seed=1 if last else 0), "random_k_seed")
    assert "seed" in message


@pytest.mark.mpi(min_size=2)
def test_a_bad_argument_on_one_rank_fails_on_every_rank():
    last = hvd.rank() == hvd.size() - 1
    message = refused_everywhere(
        lambda: hvd.Compression.test_scaled_sign(-1.0 if last else 1.0), "scaled_sign_bad")
    assert "scale=-1.0 must be positive" in message


@pytest.mark.mpi(min_size=2)
def test_another_value_of_the_variable_on_one_rank_fails_on_every_rank():
    last = hvd.rank() == hvd.size() - 1
    with pytest.raises(ValueError) as info:
        with hvdx_variables(compression=f"test_scaled_sign({2.0 if last else 1.0})"):
            make(model())
    message = str(info.value)
    assert len(set(hvd.allgather_object(message))) == 1
    assert "HVDX_COMPRESSION" in message


def uneven(**arguments):
    """Rank r takes ``4 - r % 3`` steps, joins, then every rank takes 2 more."""
    parameters = model()
    optimizer = make(parameters, **arguments)
    train(optimizer, parameters, 4 - hvd.rank() % 3)
    hvd.join()
    joined = {n: p.detach().clone() for n, p in parameters.items()}
    train(optimizer, parameters, 2, first=10)
    return joined, parameters, optimizer


@pytest.mark.mpi(min_size=1)
def test_join_counts_a_joined_rank_as_zeros_as_horovods_join():
    ours = uneven(compression=hvd.Compression.test_identity())
    theirs = uneven()
    for a, b in zip(ours[:2], theirs[:2]):
        for n in SHAPES:
            np.testing.assert_allclose(a[n].detach().numpy(), b[n].detach().numpy(),
                                       rtol=1e-6, atol=1e-6)
    steps = hvd.allgather_object(ours[2].state_dict()["hvdx_user_compression"]["step"])
    assert steps == [4 + 2] * hvd.size()


@pytest.mark.mpi(min_size=1)
def test_broadcast_optimizer_state_gives_every_rank_the_roots_step_counter():
    """Horovod's resume recipe (rank 0 loads, then broadcasts): the step counter, which
    seeds a random-k, is rank 0's everywhere; each rank keeps its own residuals."""
    parameters = model()
    optimizer = make(parameters, compression=hvd.Compression.test_random_k(2, seed=1))
    train(optimizer, parameters, 2)
    state = optimizer.state_dict()
    residuals = state["hvdx_user_compression"]["residuals"]
    if hvd.rank() != 0:  # as if only rank 0 had loaded a checkpoint
        state["hvdx_user_compression"]["step"] = 0
        optimizer.load_state_dict(state)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    after = optimizer.state_dict()["hvdx_user_compression"]
    assert hvd.allgather_object(after["step"]) == [2] * hvd.size()
    for n in SHAPES:
        assert torch.equal(after["residuals"][n], residuals[n])
    train(optimizer, parameters, 1, first=2)  # every rank steps on together


class Parameters(torch.nn.Module):
    """The test's parameters as a module, for hvd.save_checkpoint / load_checkpoint."""

    def __init__(self, parameters):
        super().__init__()
        for n, p in parameters.items():
            self.register_parameter(n, p)


@pytest.mark.mpi(min_size=1)
def test_hvd_save_checkpoint_keeps_every_ranks_residuals_and_resumes_bitwise(tmp_path):
    path = hvd.broadcast_object(str(tmp_path / "ckpt.pt"), root_rank=0, name="uc.ckpt")
    straight = model()
    train(make(straight, compression=hvd.Compression.test_random_k(3, seed=4)), straight, 5)

    first = model()
    optimizer = make(first, compression=hvd.Compression.test_random_k(3, seed=4))
    train(optimizer, first, 2)
    hvd.save_checkpoint(path, Parameters(first), optimizer, step=2)
    resumed = model()
    again = make(resumed, compression=hvd.Compression.test_random_k(3, seed=4))
    assert hvd.load_checkpoint(path, Parameters(resumed), again) == {"step": 2}
    train(again, resumed, 3, first=2)
    for n in SHAPES:
        assert torch.equal(straight[n], resumed[n])


@pytest.mark.mpi(min_size=1)
def test_sparse_gradients_are_averaged_dense_and_come_back_sparse():
    torch.manual_seed(0)
    ours, theirs = torch.nn.Embedding(6, 3, sparse=True), torch.nn.Embedding(6, 3, sparse=True)
    theirs.load_state_dict(ours.state_dict())
    results = []
    for module, arguments in ((ours, {"compression": hvd.Compression.test_identity()}),
                              (theirs, {})):
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(module.parameters(), lr=0.1),
            named_parameters=module.named_parameters(), **arguments)
        for step in range(2):
            optimizer.zero_grad()
            module(torch.tensor([hvd.rank() % 6, (step + 2) % 6])).sum().backward()
            optimizer.step()
        results.append(module.weight.detach().clone())
        if arguments:
            assert module.weight.grad.is_sparse
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=1e-6)


def expected_parameters(history):
    expected = start()
    for average in history:
        for n in SHAPES:
            expected[n] = expected[n] - LR * average[n]
    return expected


@pytest.mark.mpi(min_size=1)
def test_the_allreduce_communicator_sums_the_payloads_as_the_reference():
    """decompress is linear for a shared random-k: decompress of the summed payloads is
    the reference's sum of decompressions; each step moves one float64 ring allreduce of
    the 5 + 3 payload entries."""
    parameters = model()
    optimizer = make(parameters, compression=hvd.Compression.test_summed_random_k(5, seed=7))
    train(optimizer, parameters, 4)
    history, residuals = reference(RandomK(5, seed=7), 4)
    expected = expected_parameters(history)
    for n, p in parameters.items():
        np.testing.assert_allclose(p.detach().numpy(), expected[n], rtol=1e-5, atol=1e-6)
    saved = optimizer.state_dict()["hvdx_user_compression"]
    for n in SHAPES:
        np.testing.assert_allclose(saved["residuals"][n].numpy(), residuals[hvd.rank()][n],
                                   rtol=1e-5, atol=1e-6)
    n = hvd.size()
    assert optimizer.hvdx_stats.steps == 4
    assert optimizer.hvdx_stats.total_sent == 4 * (2 * (n - 1) * (8 * 8) // n)


@pytest.mark.mpi(min_size=1)
def test_the_memory_none_sends_each_step_alone_and_keeps_no_residual():
    parameters = model()
    optimizer = make(parameters,
                     compression=hvd.Compression.test_forgetful_random_k(5, seed=7))
    train(optimizer, parameters, 4)
    # Each step from zero residuals: nothing carried over.
    history = [reference(RandomK(5, seed=7), 1, first=step)[0][0] for step in range(4)]
    expected = expected_parameters(history)
    for n, p in parameters.items():
        np.testing.assert_allclose(p.detach().numpy(), expected[n], rtol=1e-5, atol=1e-6)
    assert optimizer.state_dict()["hvdx_user_compression"]["residuals"] == {}


@pytest.mark.mpi(min_size=2)
def test_payloads_that_differ_between_ranks_are_refused_on_every_rank_by_allreduce():
    parameters = model()
    optimizer = make(parameters, compression=hvd.Compression.test_rank_shaped())
    optimizer.zero_grad()
    for n, p in parameters.items():
        p.grad = torch.from_numpy(gradient(hvd.rank(), 0, n))
    with pytest.raises(ValueError, match="same shapes and dtypes"):
        optimizer.step()
    assert optimizer.state_dict()["hvdx_user_compression"]["step"] == 0
