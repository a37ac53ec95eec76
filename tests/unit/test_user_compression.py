"""A user's own compressor: the core step against an independent numpy reference, and
the registry that makes ``hvd.Compression.<name>`` and ``HVDX_COMPRESSION`` build it.

The MPI tests (tests/mpi/torch/test_torch_user_compression.py,
tests/mpi/tensorflow/test_tf_user_compression.py) train with it at 1, 2 and 4 ranks.
"""

import numpy as np
import pytest

import hvdx
from hvdx import compression_registry, environment
from hvdx.compression_registry import UserCompression, register_compressor
from hvdx.core.user_compression import Compressor, step_all_ranks
from hvdx.strategies.topk.spec import topk
from hvdx.strategy_contract import Job, resolve, strategy_of

pytestmark = [pytest.mark.topk, pytest.mark.user_compression, pytest.mark.int8,
              pytest.mark.sign]


class ScaledSign(Compressor):
    """payload = [sign(x), mean(|x|)]; decompress = sign * scale."""

    def __init__(self, scale=1.0):
        if not scale > 0:
            raise ValueError(f"scale={scale!r} must be positive")
        self.scale = scale

    def compress(self, x, step, name):
        return [np.sign(x).astype(np.int8), np.array(np.abs(x).mean(), x.dtype)]

    def decompress(self, payloads, shape, dtype, step, name):
        sign, mean = payloads
        return (sign.astype(dtype) * (mean * dtype.type(self.scale))).reshape(shape)

    def settings(self):
        return {"scale": self.scale}


class Identity(Compressor):
    def compress(self, x, step, name):
        return [x.copy()]

    def decompress(self, payloads, shape, dtype, step, name):
        return payloads[0].reshape(shape)


SHAPES = {"w": (3, 4), "b": (5,)}


def gradients(ranks, steps, seed=0):
    rng = np.random.default_rng(seed)
    return [[{n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
             for _ in range(ranks)] for _ in range(steps)]


def reference_scaled_sign(grads_by_step, scale=1.0):
    """Error feedback with scaled sign, written out with numpy only."""
    ranks = len(grads_by_step[0])
    residual = [{n: np.zeros(s, np.float32) for n, s in SHAPES.items()}
                for _ in range(ranks)]
    results = []
    for grads in grads_by_step:
        out = {}
        for n in SHAPES:
            decoded = []
            for r in range(ranks):
                p = grads[r][n] + residual[r][n]
                q = np.sign(p) * (np.abs(p).mean() * np.float32(scale))
                residual[r][n] = p - q
                decoded.append(q)
            out[n] = sum(decoded[1:], decoded[0].copy()) / np.float32(ranks)
        results.append(out)
    return results, residual


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_scaled_sign_with_error_feedback_matches_the_reference(ranks):
    grads_by_step = gradients(ranks, 5)
    expected, expected_residual = reference_scaled_sign(grads_by_step, 0.5)
    residuals = [{} for _ in range(ranks)]
    for step, grads in enumerate(grads_by_step):
        got = step_all_ranks(ScaledSign(0.5), grads, residuals, step)
        for n in SHAPES:
            np.testing.assert_allclose(got[n], expected[step][n], rtol=1e-6, atol=1e-7)
            assert got[n].dtype == np.float32 and got[n].shape == SHAPES[n]
    for r in range(ranks):
        for n in SHAPES:
            np.testing.assert_allclose(residuals[r][n], expected_residual[r][n], rtol=1e-6,
                                       atol=1e-7)


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_the_identity_compressor_is_plain_averaging(ranks):
    residuals = [{} for _ in range(ranks)]
    for step, grads in enumerate(gradients(ranks, 3)):
        got = step_all_ranks(Identity(), grads, residuals, step)
        for n in SHAPES:
            np.testing.assert_allclose(got[n], np.mean([g[n] for g in grads], axis=0),
                                       rtol=1e-6)
            for r in range(ranks):
                assert not residuals[r][n].any()


def test_a_non_finite_gradient_on_one_rank_changes_nothing():
    grads = gradients(2, 2)
    residuals = [{}, {}]
    step_all_ranks(ScaledSign(), grads[0], residuals, 0)
    before = [{n: r.copy() for n, r in rank.items()} for rank in residuals]
    grads[1][1]["b"][2] = np.inf
    assert step_all_ranks(ScaledSign(), grads[1], residuals, 1) is None
    for r in range(2):
        for n in SHAPES:
            np.testing.assert_array_equal(residuals[r][n], before[r][n])


def test_a_float64_gradient_is_computed_in_float64():
    grads = [{"x": np.linspace(-1, 1, 7)}]
    got = step_all_ranks(Identity(), grads, [{}], 0)
    assert got["x"].dtype == np.float64


def test_a_decompress_of_the_wrong_shape_names_the_class():
    class Bad(Identity):
        def decompress(self, payloads, shape, dtype, step, name):
            return payloads[0].reshape(-1)[:2]

    with pytest.raises(ValueError, match="Bad.decompress.*expected"):
        step_all_ranks(Bad(), gradients(1, 1)[0], [{}], 0)


# --- the registry ------------------------------------------------------------------------

@pytest.fixture
def registered():
    saved = dict(compression_registry._REGISTRY)
    register_compressor("scaled_sign", ScaledSign)
    environment.forget()
    yield
    compression_registry._REGISTRY.clear()
    compression_registry._REGISTRY.update(saved)
    environment.forget()


def job(size=2, rank=0):
    return Job(size=size, rank=rank, horovod=None, compression=None, no_compression=None,
               process_set=None, framework="test")


@pytest.mark.parametrize("name", ["topk", "none", "fp16", "fast", "safe"])
def test_a_taken_name_is_refused(name):
    with pytest.raises(ValueError, match=f"name='{name}' is already"):
        register_compressor(name, ScaledSign)


@pytest.mark.parametrize("name", ["", "my-sign", "_private", "class", 3])
def test_a_name_that_is_no_identifier_is_refused(name):
    with pytest.raises(ValueError, match="name=.*identifier"):
        register_compressor(name, ScaledSign)


def test_a_class_that_is_no_compressor_is_refused():
    with pytest.raises(TypeError, match="compressor_class=.*Compressor"):
        register_compressor("plain", dict)


def test_a_name_takes_one_class(registered):
    register_compressor("scaled_sign", ScaledSign)  # again: nothing happens
    with pytest.raises(ValueError, match="already registered for .*ScaledSign"):
        register_compressor("scaled_sign", Identity)


def test_the_builder_makes_a_compression_spec_with_the_class_and_settings(registered):
    spec = compression_registry.builder("scaled_sign")(scale=0.5)
    assert isinstance(spec, UserCompression) and spec.argument == "compression"
    assert strategy_of(spec, None) is spec
    resolved = resolve(spec, job())
    assert resolved.error is None
    assert ("compression.class", f"{__name__}.ScaledSign") in resolved.settings
    assert ("compression.settings", "[('scale', 0.5)]") in resolved.settings
    assert resolve(spec, job(rank=1)).settings == resolved.settings
    other = resolve(compression_registry.builder("scaled_sign")(scale=2.0), job())
    assert other.settings != resolved.settings
    assert spec.describe() == \
        f"scaled_sign(scale=0.5) [{__name__}.ScaledSign] settings=[('scale', 0.5)]"
    assert "0x" not in spec.describe()


def test_the_constructors_value_error_names_the_argument(registered):
    with pytest.raises(ValueError, match=r"scaled_sign\(...\): scale=-1 must be positive"):
        compression_registry.builder("scaled_sign")(scale=-1)


def test_the_builder_uncalled_is_refused(registered):
    with pytest.raises(ValueError, match="call it"):
        strategy_of(compression_registry.builder("scaled_sign"), None)


def test_settings_that_are_no_dict_are_refused_naming_the_class(registered):
    class NoDict(ScaledSign):
        def settings(self):
            return [1]

    register_compressor("no_dict", NoDict)
    with pytest.raises(ValueError, match=r"no_dict\(...\): .*NoDict.settings\(\) returned list"):
        compression_registry.builder("no_dict")()


def test_the_environment_builds_the_registered_compressor(registered):
    spec = environment.parse("HVDX_COMPRESSION", "scaled_sign(0.25)")
    assert isinstance(spec, UserCompression) and spec.compressor.scale == 0.25
    assert spec.environment == ("HVDX_COMPRESSION", "scaled_sign(0.25)")
    with pytest.raises(ValueError, match="HVDX_COMPRESSION.*scale=-2 must be positive"):
        environment.parse("HVDX_COMPRESSION", "scaled_sign(-2)")
    with pytest.raises(ValueError, match="HVDX_COMPRESSION.*does not take"):
        environment.parse("HVDX_COMPRESSION", "scaled_sign(1, 2)")


def test_an_unregistered_name_is_unknown_to_the_environment():
    with pytest.raises(ValueError, match="unknown name 'not_registered'"):
        environment.parse("HVDX_COMPRESSION", "not_registered(1)")


def test_register_compressor_is_public():
    assert hvdx.register_compressor is register_compressor


# --- the per-rank synchronizer, with ranks as threads --------------------------------------

class ThreadComm:
    """``allgather`` among threads (a stand-in for an mpi4py communicator)."""

    def __init__(self, rank, shared):
        self.rank, self.shared = rank, shared

    def Get_rank(self):
        return self.rank

    def allgather(self, value):
        barrier, slots = self.shared
        slots[self.rank] = value
        barrier.wait()
        out = list(slots)
        barrier.wait()
        return out


def run_ranks(ranks, work):
    import threading

    shared = (threading.Barrier(ranks), [None] * ranks)
    results, errors = [None] * ranks, []

    def one(rank):
        try:
            results[rank] = work(rank, ThreadComm(rank, shared))
        except Exception as error:  # noqa: BLE001
            errors.append(error)
            shared[0].abort()

    threads = [threading.Thread(target=one, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_the_synchronizer_is_the_core_step_and_its_state_round_trips(ranks):
    from hvdx.mpi.user_compression_exchange import UserCompressionSynchronizer

    grads_by_step = gradients(ranks, 4)
    grads_by_step[2][ranks - 1]["w"][0, 0] = np.nan  # a skipped step
    expected, expected_residual = reference_scaled_sign(
        [g for i, g in enumerate(grads_by_step) if i != 2])

    def work(rank, comm):
        sync = UserCompressionSynchronizer(list(SHAPES), ScaledSign(), comm)
        out = []
        for grads in grads_by_step:
            out.append(sync.synchronize_arrays([grads[rank][n] for n in SHAPES]))
        state = sync.state_dict()
        again = UserCompressionSynchronizer(list(SHAPES), ScaledSign(), comm)
        again.load_state_dict(state)
        return out, state, again.state_dict()

    for rank, (out, state, again) in enumerate(run_ranks(ranks, work)):
        assert out[2] is None
        done = [o for o in out if o is not None]
        for got, want in zip(done, expected):
            for t, n in enumerate(SHAPES):
                np.testing.assert_allclose(got[t], want[n], rtol=1e-6, atol=1e-7)
        assert state["step"] == 3 and again["step"] == 3
        for n in SHAPES:
            np.testing.assert_allclose(state["residuals"][n], expected_residual[rank][n],
                                       rtol=1e-6, atol=1e-7)
            np.testing.assert_array_equal(again["residuals"][n], state["residuals"][n])


def test_another_ranks_residuals_are_refused():
    from hvdx.mpi.user_compression_exchange import UserCompressionSynchronizer

    sync = UserCompressionSynchronizer(["w"], ScaledSign(), ThreadComm(1, None))
    with pytest.raises(ValueError, match="residuals of rank 0 and this is rank 1"):
        sync.load_state_dict({"step": 1, "rank": 0, "residuals": {"w": np.zeros(2)}})


def test_a_joined_rank_counts_as_zeros_and_its_step_follows():
    from hvdx.mpi.user_compression_exchange import UserCompressionSynchronizer

    grads = gradients(1, 1)[0][0]

    def work(rank, comm):
        sync = UserCompressionSynchronizer(list(SHAPES), Identity(), comm)
        if rank == 0:
            out = sync.synchronize_arrays([grads[n] for n in SHAPES])
        else:
            out = sync.joined_step()
        return out, sync.step, sync.joined_step()  # then both have joined

    (out0, step0, done0), (out1, step1, done1) = run_ranks(2, work)
    for t, n in enumerate(SHAPES):
        np.testing.assert_allclose(out0[t], grads[n] / 2, rtol=1e-6)
    assert out1 is False and step0 == step1 == 1 and done0 is True and done1 is True


class SharedRandomK(Compressor):
    """k entries drawn from (seed, step): the same on every rank, so decompress is
    linear in the payload and the "allreduce" communicator may sum payloads."""

    communicator = "allreduce"

    def __init__(self, k=2, seed=0):
        self.k, self.seed = k, seed

    def _indices(self, size, step):
        return np.random.default_rng([self.seed, step]).choice(size, self.k, replace=False)

    def compress(self, x, step, name):
        return [x.reshape(-1)[self._indices(x.size, step)]]

    def decompress(self, payloads, shape, dtype, step, name):
        out = np.zeros(int(np.prod(shape)), dtype)
        out[self._indices(out.size, step)] = payloads[0]
        return out.reshape(shape)


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_the_allreduce_communicator_averages_the_summed_payloads(ranks):
    """Written out: the k shared entries of every rank's corrected gradient, averaged;
    each rank keeps the rest of its own as the residual."""
    rng = np.random.default_rng(5)
    grads = [{"w": rng.standard_normal(6).astype(np.float32)} for _ in range(ranks)]
    residuals = [{} for _ in range(ranks)]
    got = step_all_ranks(SharedRandomK(2, seed=1), grads, residuals, step=4)
    picked = np.random.default_rng([1, 4]).choice(6, 2, replace=False)
    expected = np.zeros(6, np.float32)
    expected[picked] = np.mean([g["w"][picked] for g in grads], axis=0)
    np.testing.assert_allclose(got["w"], expected, rtol=1e-6)
    for g, kept in zip(grads, residuals):
        left = g["w"].copy()
        left[picked] = 0
        np.testing.assert_array_equal(kept["w"], left)


def test_the_memory_none_keeps_no_residual_and_sends_the_gradient_alone():
    class Forgetful(SharedRandomK):
        memory = "none"

    grads = [{"w": np.arange(6, dtype=np.float32)}, {"w": -np.ones(6, np.float32)}]
    residuals = [{}, {}]
    first = step_all_ranks(Forgetful(2, seed=1), grads, residuals, step=0)
    again = step_all_ranks(Forgetful(2, seed=1), grads, residuals, step=0)
    assert residuals == [{}, {}]
    np.testing.assert_array_equal(first["w"], again["w"])


@pytest.mark.parametrize("attributes, named", [
    ({"decompress": lambda self, p, s, d, t, n: p[0]}, "does not implement compress"),
    ({"compress": lambda self, x, t, n: [x]}, "does not implement decompress"),
    ({"compress": lambda self, x, t, n: [x], "decompress": lambda self, p, s, d, t, n: p[0],
      "memory": "momentum"}, "memory='momentum' must be one of"),
    ({"compress": lambda self, x, t, n: [x], "decompress": lambda self, p, s, d, t, n: p[0],
      "communicator": "broadcast"}, "communicator='broadcast' must be one of"),
])
def test_a_compressor_lacking_a_method_or_declaring_an_unknown_part_is_refused(
        registered, attributes, named):
    cls = type("Incomplete", (Compressor,), attributes)
    with pytest.raises(TypeError, match=named):
        register_compressor("incomplete", cls)
    assert "incomplete" not in compression_registry.registered()
