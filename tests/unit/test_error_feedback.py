"""Error feedback loses nothing: what was not sent stays in the residual, bad gradients never
reach it, and a checkpointed memory continues exactly where it stopped."""

import numpy as np
import pytest

from hvdx.strategies.topk.core_error_feedback import ResidualMemory
from hvdx.strategies.topk.core_selection import select_exact

pytestmark = [pytest.mark.topk]


def steps(memory, name, grads, k, copy=True):
    """Run compensate -> TopK -> update; return the sparse updates sent, densified."""
    sent = []
    for g in grads:
        a = memory.compensate(name, g)
        indices, values = select_exact(a, k)
        memory.update(name, a, indices, values, copy=copy)
        s = np.zeros_like(a)
        s[indices] = values
        sent.append(s)
    return sent


def random_grads(t, d, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(d).astype(dtype) for _ in range(t)]


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_sent_plus_residual_equals_the_sum_of_gradients(dtype, rtol):
    grads = random_grads(20, 500, dtype=dtype)
    memory = ResidualMemory(["w"])
    sent = steps(memory, "w", grads, k=10)
    total = np.sum(sent, axis=0, dtype=np.float64) + memory.get("w")
    np.testing.assert_allclose(total, np.sum(grads, axis=0, dtype=np.float64),
                               rtol=rtol, atol=rtol * 20)
    assert memory.get("w").dtype == dtype


def test_compensate_adds_the_residual_and_modifies_nothing():
    memory = ResidualMemory()
    g = np.array([1.0, -2.0, 3.0])
    a = memory.compensate("w", g)
    np.testing.assert_array_equal(a, g)
    assert a is not g
    memory.update("w", a, np.array([2]), np.array([3.0]))
    np.testing.assert_array_equal(memory.get("w"), [1.0, -2.0, 0.0])
    g2 = np.array([0.5, 0.5, 0.5])
    a2 = memory.compensate("w", g2)
    np.testing.assert_array_equal(a2, [1.5, -1.5, 0.5])
    np.testing.assert_array_equal(g2, [0.5, 0.5, 0.5])
    np.testing.assert_array_equal(memory.get("w"), [1.0, -2.0, 0.0])


def test_update_zeroes_exactly_the_sent_entries_and_keeps_the_rest():
    rng = np.random.default_rng(1)
    a = rng.standard_normal(1000).astype(np.float32)
    indices, values = select_exact(a, 37)
    memory = ResidualMemory(["w"])
    memory.update("w", a, indices, values)
    e = memory.get("w")
    assert np.all(e[indices] == 0)
    rest = np.setdiff1d(np.arange(1000), indices)
    np.testing.assert_array_equal(e[rest], a[rest])


def test_update_subtracts_values_that_differ_from_a():
    # e = a - s in general, e.g. if the values sent were quantized.
    memory = ResidualMemory()
    memory.update("w", np.array([1.0, 2.0, 3.0]), np.array([0, 2]), np.array([0.75, 2.5]))
    np.testing.assert_array_equal(memory.get("w"), [0.25, 2.0, 0.5])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_gradient_names_the_parameter_and_leaves_the_residual(bad):
    memory = ResidualMemory(["conv.weight", "fc.bias"])
    steps(memory, "fc.bias", random_grads(3, 50), k=5)
    before = memory.get("fc.bias").copy()
    g = np.ones(50)
    g[7] = bad
    with pytest.raises(ValueError, match=r"parameter 'fc.bias' has 1 NaN or Inf"):
        memory.compensate("fc.bias", g)
    np.testing.assert_array_equal(memory.get("fc.bias"), before)
    with pytest.raises(ValueError, match="'conv.weight'"):
        memory.check_finite("conv.weight", g)
    assert memory.get("conv.weight") is None


def test_finite_values_whose_sum_overflows_are_accepted():
    # The check sums first; an overflow of finite entries must not read as Inf.
    memory = ResidualMemory(["w"])
    g = np.full(8, 3e38, np.float32)
    memory.check_finite("w", g)
    np.testing.assert_array_equal(memory.compensate("w", g), g)
    g[3] = -np.inf
    with pytest.raises(ValueError, match="has 1 NaN or Inf"):
        memory.check_finite("w", g)


def test_handing_arrays_over_reuses_two_buffers_and_changes_no_result():
    grads = random_grads(6, 300, dtype=np.float32)
    copying, handing = ResidualMemory(["w"]), ResidualMemory(["w"])
    sent_c = steps(copying, "w", grads, k=7)
    buffers = set()
    for g in grads:
        sent_h = steps(handing, "w", [g], k=7, copy=False)
        buffers.add(id(handing.get("w")))
    np.testing.assert_array_equal(copying.get("w"), handing.get("w"))
    np.testing.assert_array_equal(sent_c[-1], sent_h[-1])
    assert len(buffers) <= 3  # the first step's copy, then two buffers in turn


def test_a_failed_step_after_compensate_leaves_the_residual_as_it_was():
    memory = ResidualMemory(["w"])
    grads = random_grads(3, 50, dtype=np.float32)
    steps(memory, "w", grads[:2], k=5, copy=False)
    before = memory.get("w").copy()
    memory.compensate("w", grads[2])  # ... and the step fails before update
    np.testing.assert_array_equal(memory.get("w"), before)


def test_wrong_dtype_shape_or_length_is_refused():
    memory = ResidualMemory()
    with pytest.raises(TypeError, match="'w' is float16.*float32"):
        memory.compensate("w", np.ones(4, np.float16))
    with pytest.raises(TypeError, match="int64"):
        memory.compensate("w", np.ones(4, np.int64))
    with pytest.raises(ValueError, match="flatten"):
        memory.compensate("w", np.ones((2, 2)))
    a = memory.compensate("w", np.ones(4))
    memory.update("w", a, np.array([0]), a[:1])
    with pytest.raises(ValueError, match=r"float64\[5\].*float64\[4\]"):
        memory.compensate("w", np.ones(5))
    with pytest.raises(ValueError, match=r"float32\[4\].*float64\[4\]"):
        memory.compensate("w", np.ones(4, np.float32))


def test_the_order_is_the_callers_never_a_set():
    memory = ResidualMemory(["b", "a"])
    for name in ("c", "a", "b"):
        steps(memory, name, random_grads(1, 4), k=1)
    assert memory.names == ("b", "a", "c") == tuple(memory)
    assert list(memory.state_dict()) == ["b", "a", "c"]
    assert len(memory) == 3
    with pytest.raises(TypeError, match="not a set"):
        ResidualMemory({"a", "b"})


def test_state_dict_round_trip_continues_identically():
    grads = random_grads(20, 300, seed=5, dtype=np.float32)
    original = ResidualMemory(["w"])
    steps(original, "w", grads[:10], k=7)
    state = original.state_dict()
    state["w"][0] += 1  # a copy: the memory is not affected
    state = original.state_dict()
    assert isinstance(state["w"], np.ndarray) and state["w"] is not original.get("w")

    restored = ResidualMemory(["w"])
    restored.load_state_dict(state)
    sent_a = steps(original, "w", grads[10:], k=7)
    sent_b = steps(restored, "w", grads[10:], k=7)
    for a, b in zip(sent_a, sent_b):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(original.get("w"), restored.get("w"))
    state["w"][:] = 0  # loading copied it too
    assert np.any(restored.get("w") != 0)


def test_load_state_dict_keeps_the_known_order_and_restarts_missing_names_from_zero():
    memory = ResidualMemory(["x", "y"])
    steps(memory, "x", random_grads(1, 3), k=1)
    steps(memory, "y", random_grads(1, 3), k=1)
    memory.load_state_dict({"z": np.ones(2, np.float32), "x": np.zeros(3)})
    assert memory.names == ("x", "y", "z")
    assert memory.get("y") is None
    assert memory.state_dict().keys() == {"x", "z"}


def test_set_stores_a_copy():
    memory = ResidualMemory()
    e = np.ones(3)
    memory.set("s", e)
    e[0] = 5
    np.testing.assert_array_equal(memory.get("s"), np.ones(3))
