"""The framework-neutral TopK compression spec validates its arguments at construction
and renders the same fingerprint text on every rank."""

import pytest

from hvdx.strategies.topk.core_bidirectional import TopKConfig
from hvdx.strategies.topk.spec import TopKCompression, topk

pytestmark = [pytest.mark.topk]


def test_defaults_and_description():
    spec = topk(ratio=0.01, downlink_ratio=0.01)
    assert isinstance(spec, TopKCompression)
    assert spec.ratio == 0.01 and spec.downlink_ratio == 0.01 and spec.config.bidirectional
    assert spec.describe() == ("topk ratio=0.01 downlink=0.01 mode=auto min_size=1024 "
                               "warmup_steps=0 topk_method=exact sample_size=65536 seed=0 "
                               "error_feedback=True selection=layerwise")
    assert "downlink=none" in topk(0.05).describe()
    assert topk(0.01) == topk(0.01)  # value semantics: same settings, same spec
    assert " error_feedback=False " in topk(0.01, error_feedback=False).describe()
    assert topk(0.01, selection="global").describe().endswith(" selection=global")
    assert topk(0.01, error_feedback=False) != topk(0.01)
    assert topk(0.01, sparsity_warmup_steps=4).describe().endswith(" sparsity_warmup_steps=4")
    assert topk(0.01, autotune_steps=3).describe().endswith(" autotune_steps=3")
    assert topk(0.01, momentum_correction=True, momentum_masking=False).describe().endswith(
        " momentum_correction=True momentum_masking=False")
    with pytest.raises(ValueError, match="error_feedback=1 must be True or False"):
        topk(0.01, error_feedback=1)


@pytest.mark.parametrize("kwargs, message", [
    ({"ratio": 0}, "ratio=0 "),
    ({"ratio": 1.5}, "ratio=1.5 "),
    ({"ratio": -0.1}, "ratio=-0.1 "),
    ({"ratio": 0.1, "downlink_ratio": 0.0}, "downlink_ratio=0.0 "),
    ({"ratio": 0.1, "downlink_ratio": 2}, "downlink_ratio=2 "),
    ({"mode": "ring"}, "mode='ring'"),
    ({"min_size": -1}, "min_size=-1"),
    ({"warmup_steps": 1.5}, "warmup_steps=1.5"),
    ({"sparsity_warmup_steps": -1}, "sparsity_warmup_steps=-1"),
    ({"autotune_steps": 2.0}, "autotune_steps=2.0"),
    ({"momentum_correction": True, "momentum_masking": 0}, "momentum_masking=0"),
    ({"momentum_masking": False}, "momentum_masking=False applies to momentum_correction"),
    ({"selector": "random"}, "selector='random'"),
    ({"topk_method": "random"}, "topk_method='random'"),
    ({"topk_method": "threshold_sampled"}, "topk_method='threshold_sampled'"),
    ({"small_tensors": "in_exchange"}, "small_tensors='in_exchange'"),
    ({"seed": -3}, "seed=-3"),
    ({"selection": "per-layer"}, "selection='per-layer'"),
    ({"small_tensors": "nccl"}, "small_tensors='nccl'"),
])
def test_bad_arguments_raise_naming_the_argument_and_value(kwargs, message):
    with pytest.raises(ValueError) as info:
        topk(**kwargs)
    assert message in str(info.value) + " "


def test_ratio_one_is_accepted():
    assert topk(1.0, 1.0).config.k_up(10) == 10


@pytest.mark.parametrize("mode, size, expected", [
    ("auto", 1, "gathered"), ("auto", 2, "gathered"), ("auto", 3, "sharded"),
    ("auto", 64, "sharded"), ("gathered", 8, "gathered"), ("sharded", 1, "sharded"),
])
def test_auto_mode_is_sharded_above_two_ranks(mode, size, expected):
    assert topk(0.01, mode=mode).resolve_mode(size) == expected


def test_spec_needs_a_core_config():
    with pytest.raises(TypeError):
        TopKCompression(0.01)
    assert TopKCompression(TopKConfig(0.5)).mode == "auto"


def test_different_ratios_give_different_fingerprint_text():
    assert topk(0.01).describe() != topk(0.010000001).describe()


def test_who_averages_the_small_tensors_is_part_of_the_fingerprint_text():
    assert "small_tensors" not in topk(0.01).describe()
    assert topk(0.01, small_tensors="in_topk_step").describe().endswith(
        " small_tensors=in_topk_step")


# Renamed options: topk_method (was selector, "threshold" -> "sampled_threshold") and the
# values of small_tensors ("horovod" -> "horovod_allreduce", "hvdx" -> "in_topk_step").
# The old spelling builds the same spec, hence the same fingerprint text on every rank.
@pytest.mark.parametrize("old, new", [
    ({"selector": "exact"}, {"topk_method": "exact"}),
    ({"selector": "threshold"}, {"topk_method": "sampled_threshold"}),
    ({"selector": "sampled_threshold"}, {"topk_method": "sampled_threshold"}),
    ({"topk_method": "threshold"}, {"topk_method": "sampled_threshold"}),
    ({"selector": "threshold", "topk_method": "sampled_threshold"},
     {"topk_method": "sampled_threshold"}),
    ({"selector": None}, {}),
    ({"small_tensors": "horovod"}, {"small_tensors": "horovod_allreduce"}),
    ({"small_tensors": "hvdx"}, {"small_tensors": "in_topk_step"}),
    ({"selector": "threshold", "small_tensors": "hvdx"},
     {"topk_method": "sampled_threshold", "small_tensors": "in_topk_step"}),
])
def test_old_names_and_values_build_the_same_spec_and_fingerprint_text(old, new):
    spec, renamed = topk(0.01, 0.01, **old), topk(0.01, 0.01, **new)
    assert spec == renamed and spec.config == renamed.config
    assert spec.describe() == renamed.describe()
    assert "selector" not in spec.describe() and "=threshold" not in spec.describe()
    assert "=hvdx" not in spec.describe() and "=horovod " not in spec.describe() + " "


def test_the_spec_and_the_config_store_the_new_values():
    spec = topk(0.01, selector="threshold", small_tensors="hvdx")
    assert (spec.config.topk_method, spec.small_tensors) == ("sampled_threshold",
                                                             "in_topk_step")
    assert TopKCompression(TopKConfig(0.5, topk_method="threshold"),
                           small_tensors="horovod") == TopKCompression(
        TopKConfig(0.5, topk_method="sampled_threshold"), small_tensors="horovod_allreduce")
    assert topk(0.01, small_tensors="hvdx").describe().endswith(" small_tensors=in_topk_step")


@pytest.mark.parametrize("kwargs, message", [
    ({"selector": "threshold", "topk_method": "exact"},
     "selector='threshold' and topk_method='exact' disagree: selector is the old name of "
     "topk_method; give topk_method only"),
    ({"selector": "exact", "topk_method": "sampled_threshold"},
     "selector='exact' and topk_method='sampled_threshold' disagree"),
    # a bad value of either is named as given
    ({"selector": "exact", "topk_method": "bogus"}, "topk_method='bogus' must be one of"),
    ({"selector": "bogus", "topk_method": "exact"}, "selector='bogus' must be one of"),
])
def test_an_old_name_and_its_new_one_that_disagree_raise_naming_both(kwargs, message):
    with pytest.raises(ValueError) as info:
        topk(0.01, **kwargs)
    assert message in str(info.value)
    with pytest.raises(ValueError) as info:  # with a preset, before its values apply
        topk(preset="fast", **kwargs)
    assert message in str(info.value)


def test_the_signature_lists_the_new_names_and_the_old_one_last():
    import inspect

    parameters = inspect.signature(topk).parameters
    assert parameters["topk_method"].default == "exact"
    assert parameters["small_tensors"].default == "horovod_allreduce"
    assert list(parameters)[-1] == "selector" and parameters["selector"].default is None
