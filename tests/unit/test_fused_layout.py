"""The fused buffers of a neighbour exchange: families, offsets, a lossless round trip,
and the presence flags that let Stanza's role sums agree which tensors no rank had."""

import numpy as np
import pytest

from hvdx.core.fused_layout import FusedLayout, family_of

pytestmark = [pytest.mark.stanza]


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


def test_presence_flags_follow_the_first_familys_values_one_per_tensor():
    layout = FusedLayout([("float64", 2), ("float32", 3), ("float64", 1)], flags=True)
    assert layout.flag_family == np.dtype(np.float32)
    assert layout.ends == {np.dtype(np.float32): 3, np.dtype(np.float64): 3}
    assert layout.families == {np.dtype(np.float32): 3 + 3, np.dtype(np.float64): 3}
    buffers = layout.pack([np.ones(2), np.ones(3, np.float32), np.ones(1)])
    layout.set_flags(buffers, [True, False, True])
    np.testing.assert_array_equal(buffers[np.dtype(np.float32)], [1, 1, 1, 1, 0, 1])
    # The values are untouched by the flags and read back as before.
    back = layout.unpack(buffers, [np.zeros(2), np.zeros(3, np.float32), np.zeros(1)])
    assert all(np.array_equal(b, np.ones_like(b)) for b in back)


def test_summed_buffers_count_per_tensor_the_ranks_that_had_it():
    # What a summing allreduce over three ranks does to the flags: a tensor no rank
    # had counts 0 on every rank, one that some had counts them.
    layout = FusedLayout([("float64", 2), ("float64", 1), ("float64", 3)], flags=True)
    had = [[True, False, False], [True, True, False], [True, False, False]]
    total = None
    for present in had:
        buffers = layout.pack([np.full(2, 1.0), np.full(1, 2.0), np.zeros(3)])
        layout.set_flags(buffers, present)
        total = buffers if total is None else {f: total[f] + b for f, b in buffers.items()}
    np.testing.assert_array_equal(layout.flag_counts(total), [3, 1, 0])


def test_without_flags_the_buffers_hold_only_the_values():
    layout = FusedLayout([("float32", 3)])
    assert layout.flag_family is None and layout.families == layout.ends
    with pytest.raises(ValueError, match="without flags"):
        layout.set_flags(layout.pack([np.zeros(3)]), [True])
    empty = FusedLayout([], flags=True)
    assert empty.flag_family is None and empty.families == {}
    assert empty.flag_counts({}).size == 0


def test_a_wrong_number_of_flags_is_refused():
    layout = FusedLayout([("float32", 1), ("float32", 1)], flags=True)
    with pytest.raises(ValueError, match="holds 2 tensors, got 1 flags"):
        layout.set_flags(layout.pack([np.zeros(1), np.zeros(1)]), [True])
