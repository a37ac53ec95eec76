"""``Compression.topk(preset=...)``: the benchmark's tuned TopKs by name, overridable,
and the benchmark built from the same table."""

import pytest

from hvdx.compression import topk
from hvdx.strategy import strategy_of


def test_fast_is_one_percent_both_ways_with_dgc_momentum_without_masking():
    assert topk(preset="fast") == topk(
        0.01, 0.01, topk_method="sampled_threshold", selection="global",
        momentum_correction=True, momentum_masking=False, small_tensors="in_topk_step")


def test_safe_has_a_downlink_twice_as_dense_and_dgc_masking():
    assert topk(preset="safe") == topk(
        0.01, 0.02, topk_method="sampled_threshold", selection="global",
        momentum_correction=True, momentum_masking=True, small_tensors="in_topk_step")


def test_arguments_given_with_a_preset_override_it_even_at_their_defaults():
    spec = topk(0.05, preset="safe", topk_method="exact", momentum_masking=False)
    assert (spec.ratio, spec.downlink_ratio) == (0.05, 0.02)
    assert spec.config.topk_method == "exact" and not spec.momentum_masking
    # The old names override too, as their new ones.
    assert topk(preset="safe", selector="exact", small_tensors="horovod") == topk(
        preset="safe", topk_method="exact", small_tensors="horovod_allreduce")
    # A default value given on purpose still overrides (fast masks nothing).
    assert topk(preset="fast", momentum_masking=True).momentum_masking
    assert topk(preset="fast", downlink_ratio=None).downlink_ratio is None


def test_an_unknown_preset_names_the_argument_and_lists_the_presets():
    with pytest.raises(ValueError, match=r"preset='fastest' must be one of 'fast', 'safe'"):
        topk(preset="fastest")


def test_an_argument_topk_does_not_take_is_a_type_error_with_a_preset_too():
    with pytest.raises(TypeError, match="cross_every"):
        topk(preset="fast", cross_every=4)


def test_the_signature_shows_preset_and_every_argument():
    import inspect

    parameters = inspect.signature(topk).parameters
    assert list(parameters)[:4] == ["ratio", "downlink_ratio", "preset", "mode"]
    assert parameters["preset"].default is None


def test_topk_passed_without_calling_it_is_refused_saying_to_call_it():
    with pytest.raises(ValueError, match=r"compression=topk: call it: "
                                         r"compression=hvd\.Compression\.topk\("):
        strategy_of(topk, None)


@pytest.mark.parametrize("name, preset", [("topk_dgc", "fast"), ("topk_masked", "safe")])
def test_the_benchmarks_tuned_topks_are_the_presets_with_horovods_50_ms_cycle(
        name, preset, monkeypatch):
    hvd = pytest.importorskip("hvdx.torch")
    from hvdx.bench.strategies import STRATEGIES

    monkeypatch.setattr(hvd, "DistributedOptimizer",
                        lambda optimizer, named_parameters, compression: compression)
    model = pytest.importorskip("torch").nn.Linear(2, 1)
    assert STRATEGIES[name].build(None, model) == topk(preset=preset)
    assert STRATEGIES[name].env == {"HOROVOD_CYCLE_TIME": "50"}
