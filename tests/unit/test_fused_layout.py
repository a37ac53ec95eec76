"""The fused buffers of a neighbour exchange: families, offsets, and a lossless round trip."""

import numpy as np
import pytest

from hvdx.core.fused_layout import FusedLayout, family_of


@pytest.mark.parametrize("name,family", [
    ("float64", np.float64), ("torch.float64", np.float64), ("double", np.float64),
    ("float32", np.float32), ("float16", np.float32), ("bfloat16", np.float32),
    ("torch.bfloat16", np.float32)])
def test_float64_travels_as_itself_every_other_float_as_float32(name, family):
    assert family_of(name) == np.dtype(family)


def test_tensors_lie_back_to_back_per_family_in_the_order_given():
    layout = FusedLayout([("float32", 3), ("float64", 2), ("float16", 4), ("float64", 1)])
    assert list(layout.families.items()) == [(np.dtype(np.float32), 7),
                                             (np.dtype(np.float64), 3)]
    assert [tuple(s) for s in layout.slots[np.dtype(np.float32)]] == [(0, 0, 3), (2, 3, 4)]
    assert [tuple(s) for s in layout.slots[np.dtype(np.float64)]] == [(1, 0, 2), (3, 2, 1)]


@pytest.mark.parametrize("shapes", [[(2, 3), (0,), (1,), (4, 1, 2)], [()], []])
def test_pack_then_unpack_gives_the_values_back_with_their_shapes_and_dtypes(shapes):
    rng = np.random.default_rng(0)
    dtypes = [np.float64, np.float32, np.float16, np.float64]
    values = [rng.normal(size=s).astype(dtypes[i % 4]) for i, s in enumerate(shapes)]
    layout = FusedLayout([(v.dtype.name, v.size) for v in values])
    buffers = layout.pack(values)
    for family, buffer in buffers.items():
        assert buffer.dtype == family and buffer.ndim == 1
    back = layout.unpack(buffers, values)
    for v, b in zip(values, back):
        assert b.dtype == v.dtype and b.shape == v.shape
        np.testing.assert_array_equal(b, v)


def test_pack_reuses_the_buffers_it_is_given():
    layout = FusedLayout([("float64", 2)])
    out = {np.dtype(np.float64): np.zeros(2)}
    assert layout.pack([np.array([1.0, 2.0])], out=out) is out
    np.testing.assert_array_equal(out[np.dtype(np.float64)], [1.0, 2.0])


def test_a_wrong_number_of_values_is_refused():
    with pytest.raises(ValueError, match="holds 2 tensors, got 1"):
        FusedLayout([("float32", 1), ("float32", 1)]).pack([np.zeros(1)])
