"""The built-in low-precision compressions, ``int8`` (ByteGrad's min-max quantisation
per chunk) and ``sign`` (EF-SignSGD): each compressor against a numpy reference written
here, their bounds and edge cases, error feedback over two steps, their arguments, and
the names that build them (``hvd.Compression.int8``, ``HVDX_COMPRESSION``).

The MPI tests (tests/mpi/torch/test_torch_low_precision.py,
tests/mpi/tensorflow/test_tf_low_precision.py) train with them at 2 ranks.
"""

import numpy as np
import pytest

from hvdx import environment
from hvdx.compression_registry import UserCompression, register_compressor
from hvdx.core.user_compression import step_all_ranks
from hvdx.strategies import catalogue
from hvdx.strategies.low_precision.core_int8 import Int8Compressor
from hvdx.strategies.low_precision.core_sign import SignCompressor
from hvdx.strategies.low_precision.spec import (Int8Compression, SignCompression, int8,
                                                sign)
from hvdx.strategy_contract import strategy_of

pytestmark = [pytest.mark.int8, pytest.mark.sign, pytest.mark.user_compression]


def round_trip(compressor, x):
    payloads = compressor.compress(x, 0, "t")
    return compressor.decompress(payloads, x.shape, x.dtype, 0, "t")


# --- int8 ------------------------------------------------------------------------------------

def test_int8_quantises_a_chunk_as_written_by_hand():
    # One chunk, min -1 and max 1.55: a step of 2.55 / 255 = 0.01.
    x = np.array([-1.0, 0.0, 1.55, 0.504, 0.5, -0.996], np.float32)
    lo, hi, codes = Int8Compressor(chunk=8).compress(x, 0, "t")
    assert lo.dtype == hi.dtype == np.float32 and codes.dtype == np.uint8
    np.testing.assert_array_equal(lo, [-1.0])
    np.testing.assert_array_equal(hi, np.float32([1.55]))
    # q = round((x - min) / 0.01): 0, 100, 255, 150.4 -> 150, 150, 0.4 -> 0.
    np.testing.assert_array_equal(codes, [0, 100, 255, 150, 150, 0])
    got = Int8Compressor(chunk=8).decompress([lo, hi, codes], x.shape, x.dtype, 0, "t")
    step = (np.float64(np.float32(1.55)) + 1.0) / 255
    np.testing.assert_allclose(got, -1.0 + np.array([0, 100, 255, 150, 150, 0]) * step,
                               rtol=1e-6)


def int8_reference(x, chunk):
    """Min-max quantisation per chunk, one chunk at a time."""
    out = np.empty(x.size)
    flat = x.reshape(-1).astype(np.float64)
    for start in range(0, x.size, chunk):
        piece = flat[start:start + chunk]
        lo, hi = np.float64(np.float32(piece.min())), np.float64(np.float32(piece.max()))
        q = np.round((piece - lo) / (hi - lo) * 255) if hi > lo else np.zeros(piece.size)
        out[start:start + chunk] = lo + q * (hi - lo) / 255
    return out.reshape(x.shape)


@pytest.mark.parametrize("size, chunk", [(10, 4), (1000, 64), (7, 7), (7, 100), (5, 1)])
def test_int8_round_trip_matches_the_reference_and_stays_within_half_a_step(size, chunk):
    """Lengths not divisible by the chunk included: the last chunk is shorter."""
    x = np.random.default_rng(size).standard_normal(size).astype(np.float32) * 3
    got = round_trip(Int8Compressor(chunk), x)
    np.testing.assert_allclose(got, int8_reference(x, chunk), rtol=1e-6, atol=1e-7)
    for start in range(0, size, chunk):
        piece, back = x[start:start + chunk], got[start:start + chunk]
        bound = (np.float64(piece.max()) - piece.min()) / 510
        assert np.all(np.abs(piece.astype(np.float64) - back) <= bound * (1 + 1e-6) + 1e-7)


def test_int8_sends_one_min_and_max_per_chunk_and_one_byte_per_entry():
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    lo, hi, codes = Int8Compressor(chunk=4).compress(x, 0, "t")
    np.testing.assert_array_equal(lo, [0, 4, 8])
    np.testing.assert_array_equal(hi, [3, 7, 9])
    assert codes.shape == (10,) and codes[-1] == 255 and codes[-2] == 0


def test_int8_a_constant_chunk_sends_zero_codes_and_decompresses_to_its_value():
    x = np.array([2.5, 2.5, 2.5, -1.0, 3.0], np.float32)
    lo, hi, codes = Int8Compressor(chunk=3).compress(x, 0, "t")
    np.testing.assert_array_equal(codes[:3], [0, 0, 0])
    np.testing.assert_array_equal(round_trip(Int8Compressor(chunk=3), x)[:3], [2.5] * 3)


def test_int8_keeps_the_shape_and_dtype():
    x = np.random.default_rng(1).standard_normal((3, 4, 2))
    got = round_trip(Int8Compressor(5), x)
    assert got.shape == x.shape and got.dtype == np.float64
    empty = np.zeros((0, 3), np.float32)
    assert round_trip(Int8Compressor(5), empty).shape == (0, 3)


@pytest.mark.parametrize("chunk", [0, -3, 1.5, "8", True])
def test_int8_refuses_a_chunk_that_is_no_integer_of_at_least_one(chunk):
    with pytest.raises(ValueError, match=rf"chunk={chunk!r} must be an integer"):
        Int8Compressor(chunk)
    with pytest.raises(ValueError, match=rf"int8\(...\): chunk={chunk!r} must be an integer"):
        int8(chunk=chunk)


# --- sign ------------------------------------------------------------------------------------

def test_sign_sends_packed_bits_and_the_mean_magnitude():
    x = np.array([1.0, -2.0, 0.0, -0.5, 3.0, 4.0, -1.0, 2.0, -6.0], np.float32)
    bits, scale = SignCompressor().compress(x, 0, "t")
    # x < 0 at 1, 3, 6 and 8: 0b01010010 and 0b10000000.
    np.testing.assert_array_equal(bits, np.array([0b01010010, 0b10000000], np.uint8))
    assert scale.dtype == np.float32 and scale == np.float32(19.5 / 9)
    got = SignCompressor().decompress([bits, scale], x.shape, x.dtype, 0, "t")
    np.testing.assert_array_equal(
        got, np.float32(19.5 / 9) * np.float32([1, -1, 1, -1, 1, 1, -1, 1, -1]))


def test_sign_round_trip_keeps_signs_shape_and_the_l1_norm():
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    got = round_trip(SignCompressor(), x)
    assert got.shape == x.shape and got.dtype == np.float32
    np.testing.assert_array_equal(np.sign(got), np.sign(x))
    np.testing.assert_allclose(np.abs(got).sum(), np.abs(x).sum(), rtol=1e-5)


# --- error feedback, as the synchronizer runs them -------------------------------------------

@pytest.mark.parametrize("compressor, reference", [
    (Int8Compressor(chunk=4), lambda p: int8_reference(p, 4)),
    (SignCompressor(), lambda p: np.where(p < 0, -1.0, 1.0) *
     np.float32(np.abs(p).mean(dtype=np.float64))),
])
def test_two_steps_of_error_feedback_at_two_ranks(compressor, reference):
    """residual = corrected - decompressed; the result is the average of every rank's
    decompressed corrected gradient."""
    rng = np.random.default_rng(3)
    grads = [[{"w": rng.standard_normal((2, 5)).astype(np.float32)} for _ in range(2)]
             for _ in range(2)]
    residuals, expected = [{}, {}], [np.zeros((2, 5), np.float32)] * 2
    for step in range(2):
        sent = []
        for r in range(2):
            corrected = grads[step][r]["w"] + expected[r]
            decoded = reference(corrected)
            expected[r] = corrected - decoded
            sent.append(decoded)
        got = step_all_ranks(compressor, grads[step], residuals, step)
        np.testing.assert_allclose(got["w"], (sent[0] + sent[1]) / 2, rtol=1e-5, atol=1e-6)
        for r in range(2):
            np.testing.assert_allclose(residuals[r]["w"], expected[r], rtol=1e-5,
                                       atol=1e-6)
    assert compressor.memory == "residual" and compressor.communicator == "allgather"


# --- the names that build them ------------------------------------------------------------

@pytest.mark.parametrize("raw, kind, settings", [
    ("int8", Int8Compression, [("chunk", 1024)]),
    ("int8(chunk=256)", Int8Compression, [("chunk", 256)]),
    ("int8(16)", Int8Compression, [("chunk", 16)]),
    ("sign", SignCompression, []),
    ("sign()", SignCompression, []),
])
def test_the_environment_builds_them(raw, kind, settings):
    spec = environment.parse("HVDX_COMPRESSION", raw)
    assert type(spec) is kind and isinstance(spec, UserCompression)
    assert spec.settings == settings
    assert catalogue.descriptor(spec.name).synchronizer == \
        "hvdx.mpi.user_compression_exchange:UserCompressionSynchronizer"


@pytest.mark.parametrize("raw, message", [
    ("int8(chunk=0)", "chunk=0 must be an integer"),
    ("int8(chunk=1.5)", "chunk=1.5 must be an integer"),
    ("int8(chunks=4)", "did you mean 'chunk'"),
    ("sign(0.5)", r"sign\(\) does not take these arguments"),
])
def test_the_environment_refuses_bad_arguments_naming_them(raw, message):
    with pytest.raises(ValueError, match=message):
        environment.parse("HVDX_COMPRESSION", raw)


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_the_frameworks_compression_classes_build_them(framework):
    hvd = pytest.importorskip(f"hvdx.{framework}")
    assert hvd.Compression.int8(chunk=256).describe() == int8(chunk=256).describe() == \
        "int8(chunk=256) [hvdx.strategies.low_precision.core_int8.Int8Compressor] " \
        "settings=[('chunk', 256)]"
    assert hvd.Compression.sign().describe() == sign().describe()


def test_their_names_are_not_for_users_to_register():
    for name in ("int8", "sign"):
        with pytest.raises(ValueError, match=rf"name='{name}' is already"):
            register_compressor(name, SignCompressor)


def test_a_constructor_uncalled_is_refused():
    for constructor in (int8, sign):
        with pytest.raises(ValueError, match="call it"):
            strategy_of(constructor, None)
