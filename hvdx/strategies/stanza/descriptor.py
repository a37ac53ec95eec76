"""Stanza's entry in the strategy catalogue (:data:`hvdx.strategies.catalogue.BUILT_IN`).

Its adapters are lazy paths ``"module:attribute"`` (:mod:`hvdx.strategies.descriptor`):
importing this module imports no framework.
"""

from hvdx.strategies.descriptor import BenchVariant, PlanOption, StrategyDescriptor

__all__ = ["STANZA"]

STANZA = StrategyDescriptor(
    name="stanza", kind="trainer", title="Stanza",
    torch_trainer="hvdx.strategies.stanza.torch.trainer:Stanza",
    tensorflow_trainer="hvdx.strategies.stanza.tensorflow.trainer:Stanza",
    cost_model="stanza", cost_layout="hvdx.strategies.stanza.core_cost:_stanza",
    bench=tuple(BenchVariant(name, "hvdx.strategies.stanza.bench_rows:stanza_strategy", kwargs,
                             default=name == "stanza") for name, kwargs in (
        ("stanza", {"fc_workers": 1}), ("stanza_f2", {"fc_workers": 2}),
        ("stanza_auto", {"fc_workers": "auto"}),
        ("stanza_micro", {"fc_workers": 1, "micro_batches": 4}))),
    plan_line="hvdx.strategies.stanza.plan_line:stanza_line",
    plan_options=(PlanOption("--fc-workers", int, "stanza: FC workers", 1),))
