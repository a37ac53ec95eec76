"""``Compression.topk(preset=...)``: the benchmark's tuned TopKs by name, overridable,
and the benchmark built from the same table."""

import pytest

from hvdx.strategies.topk.presets import for_optimizer, momentum_correction_refusal
from hvdx.strategies.topk.spec import topk
from hvdx.strategy_contract import strategy_of

pytestmark = [pytest.mark.topk]


def test_fast_is_one_percent_both_ways_with_dgc_momentum_and_masking():
    assert topk(preset="fast") == topk(
        0.01, 0.01, topk_method="sampled_threshold", selection="global",
        momentum_correction=True, momentum_masking=True, small_tensors="in_topk_step")


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
    # A value given on purpose overrides: fast without its masking.
    assert not topk(preset="fast", momentum_masking=False).momentum_masking
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


@pytest.mark.parametrize("name, preset", [("fast", "fast"), ("safe", "safe")])
def test_the_benchmarks_tuned_topks_are_the_presets_with_horovods_defaults(
        name, preset, monkeypatch):
    hvd = pytest.importorskip("hvdx.torch")
    from hvdx.bench.strategies import STRATEGIES

    monkeypatch.setattr(hvd, "DistributedOptimizer",
                        lambda optimizer, named_parameters, compression: compression)
    model = pytest.importorskip("torch").nn.Linear(2, 1)
    assert STRATEGIES[name].build(None, model) == topk(preset=preset)
    assert STRATEGIES[name].env == {}  # the baseline's settings: no tuning of its own


# --- momentum correction only where it applies ------------------------------------------

#: The presets' settings other than momentum correction, given one by one.
WITHOUT_CORRECTION = {
    "fast": dict(ratio=0.01, downlink_ratio=0.01, topk_method="sampled_threshold",
                 selection="global", small_tensors="in_topk_step"),
    "safe": dict(ratio=0.01, downlink_ratio=0.02, topk_method="sampled_threshold",
                 selection="global", small_tensors="in_topk_step"),
}

#: torch's parameter groups as plain dicts (their keys are what decides).
SGD_MOMENTUM = {"lr": 0.1, "momentum": 0.9, "dampening": 0, "weight_decay": 0,
                "nesterov": False}
ADAM = {"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0,
        "amsgrad": False}


@pytest.mark.parametrize("preset", ["fast", "safe"])
def test_momentum_correction_false_with_a_preset_drops_its_masking_setting_too(preset):
    """The preset's masking goes with its momentum correction: no masking setting is
    left to refuse without momentum correction."""
    spec = topk(preset=preset, momentum_correction=False)
    assert spec.error is None
    assert spec == topk(**WITHOUT_CORRECTION[preset])
    assert not spec.momentum_correction and spec.momentum_masking


def test_the_callers_own_masking_without_momentum_correction_is_still_refused():
    with pytest.raises(ValueError, match="momentum_masking=False applies to "
                                         "momentum_correction=True only"):
        topk(preset="fast", momentum_correction=False, momentum_masking=False)


def test_the_spec_knows_which_settings_are_the_presets():
    assert "momentum_correction" in topk(preset="fast").from_preset
    assert topk(preset="fast").preset == "fast"
    assert "momentum_correction" not in topk(preset="fast",
                                             momentum_correction=True).from_preset
    assert "ratio" not in topk(0.05, preset="safe").from_preset
    assert topk(0.01, momentum_correction=True).from_preset == frozenset()


@pytest.mark.parametrize("preset", ["fast", "safe"])
@pytest.mark.parametrize("name, groups, why", [
    ("Adam", [ADAM], "Adam is not torch.optim.SGD"),
    ("SGD", [dict(SGD_MOMENTUM, nesterov=True)], "nesterov=True, dampening=0"),
    ("SGD", [dict(SGD_MOMENTUM, dampening=0.1)], "nesterov=False, dampening=0.1"),
    ("SGD", [dict(SGD_MOMENTUM, momentum=0)], "momentum 0 in every parameter group"),
    # one group that is not plain SGD's is enough
    ("SGD", [SGD_MOMENTUM, dict(SGD_MOMENTUM, nesterov=True)], "nesterov=True"),
])
def test_a_preset_runs_without_momentum_correction_where_it_does_not_apply(
        preset, name, groups, why):
    spec = topk(preset=preset)
    fitted, reason = for_optimizer(spec, name, groups)
    # Adam's family also sends 20% both ways (the next tests).
    expected = topk(**dict(WITHOUT_CORRECTION[preset],
                           **(ADAPTIVE if name == "Adam" else {})))
    assert fitted == expected and fitted.describe() == expected.describe()
    assert why in reason
    # the same answer for the same optimizer: what every rank computes
    assert for_optimizer(spec, name, groups) == (fitted, reason)


@pytest.mark.parametrize("groups", [
    [SGD_MOMENTUM],
    # a group without momentum next to one with it: the correction applies (m = 0 there)
    [SGD_MOMENTUM, dict(SGD_MOMENTUM, momentum=0)],
])
def test_a_preset_keeps_momentum_correction_for_sgd_with_momentum(groups):
    spec = topk(preset="fast")
    assert for_optimizer(spec, "SGD", groups) == (spec, None)
    assert for_optimizer(spec, "SGD", groups)[0].momentum_correction


@pytest.mark.parametrize("spec", [
    topk(0.01, momentum_correction=True),
    topk(0.01, 0.02),
    topk(0.05, 0.05, preset="safe", momentum_correction=False),
], ids=["explicit-true", "plain", "preset-with-its-ratios-and-correction-given"])
def test_the_callers_own_settings_are_never_changed(spec):
    fitted, reason = for_optimizer(spec, "Adam", [ADAM])
    assert fitted is spec and reason is None


@pytest.mark.parametrize("spec", [
    topk(preset="fast", momentum_correction=True),  # the caller's: refused later
    topk(preset="fast", momentum_correction=False),
], ids=["preset-explicit-true", "preset-explicit-false"])
def test_the_callers_own_momentum_correction_stays_and_the_presets_ratios_follow_adam(spec):
    fitted, reason = for_optimizer(spec, "Adam", [ADAM])
    assert fitted.momentum_correction == spec.momentum_correction
    assert (fitted.ratio, fitted.downlink_ratio) == (0.2, 0.2)
    assert "momentum correction" not in reason and "Adam is adaptive" in reason


ADAPTIVE = dict(ratio=0.2, downlink_ratio=0.2)


@pytest.mark.parametrize("name, groups", [
    ("Adam", [ADAM]),
    ("AdamW", [dict(ADAM, weight_decay=0.01)]),
    ("NAdam", [ADAM, dict(ADAM, lr=0.01)]),  # every group is Adam's
])
def test_an_adaptive_optimizer_makes_a_presets_ratios_twenty_percent(name, groups):
    fitted, reason = for_optimizer(topk(preset="fast"), name, groups)
    assert (fitted.ratio, fitted.downlink_ratio) == (0.2, 0.2)
    assert "sends ratio=0.2, downlink_ratio=0.2" in reason and f"{name} is adaptive" in reason
    # a ratio the caller gave stays; the preset's other one follows the optimizer
    fitted, _ = for_optimizer(topk(0.05, preset="safe"), name, groups)
    assert (fitted.ratio, fitted.downlink_ratio) == (0.05, 0.2)
    # a unidirectional TopK the caller asked for stays unidirectional
    fitted, _ = for_optimizer(topk(preset="safe", downlink_ratio=None), name, groups)
    assert (fitted.ratio, fitted.downlink_ratio) == (0.2, None)


def test_sgd_and_a_group_without_adams_betas_keep_the_presets_ratios():
    for name, groups in [("SGD", [SGD_MOMENTUM]), ("SGD", [dict(SGD_MOMENTUM, momentum=0)]),
                         ("Mixed", [ADAM, SGD_MOMENTUM])]:
        fitted, _ = for_optimizer(topk(preset="safe"), name, groups)
        assert (fitted.ratio, fitted.downlink_ratio) == (0.01, 0.02), name


def test_the_variable_a_preset_came_from_stays_on_the_changed_spec():
    from hvdx.environment import parse

    spec = parse("HVDX_COMPRESSION", "fast")
    fitted, _ = for_optimizer(spec, "Adam", [ADAM])
    assert fitted.environment == ("HVDX_COMPRESSION", "fast")
    assert not fitted.momentum_correction


@pytest.mark.parametrize("name, groups, message", [
    ("Adam", [ADAM], "momentum_correction=True needs torch.optim.SGD (with momentum), got "
                     "Adam; use momentum_correction=False"),
    ("SGD", [dict(SGD_MOMENTUM, nesterov=True)],
     "momentum_correction=True supports SGD without Nesterov or dampening, got "
     "nesterov=True, dampening=0"),
    ("SGD", [SGD_MOMENTUM], None),
    ("SGD", [dict(SGD_MOMENTUM, momentum=0)], None),  # accepted when asked for explicitly
])
def test_the_refusal_of_an_explicit_momentum_correction(name, groups, message):
    assert momentum_correction_refusal(name, groups) == message


def test_tensorflow_presets_run_without_momentum_correction_as_the_torch_fallback():
    from hvdx.strategies.topk.presets import WITHOUT_MOMENTUM_CORRECTION

    nesterov = [dict(SGD_MOMENTUM, nesterov=True)]
    assert topk(preset="safe", **WITHOUT_MOMENTUM_CORRECTION) == \
        for_optimizer(topk(preset="safe"), "SGD", nesterov)[0]
