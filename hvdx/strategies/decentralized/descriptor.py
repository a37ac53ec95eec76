"""Decentralized SGD's entry in the strategy catalogue (:data:`hvdx.strategies.catalogue.BUILT_IN`).

Its mixer is :class:`hvdx.strategies.decentralized.mixer.GraphMixer` (the spec's
``make_mixer``), which the shared mixing drivers run; its lazy paths ``"module:attribute"``
(:mod:`hvdx.strategies.descriptor`) import no framework.
"""

from hvdx.strategies.descriptor import BenchVariant, Constructor, PlanOption, StrategyDescriptor

__all__ = ["DECENTRALIZED"]

DECENTRALIZED = StrategyDescriptor(
    name="decentralized", kind="sync", title="decentralized SGD",
    constructors=(Constructor("Decentralized",
                              "hvdx.strategies.decentralized.spec:Decentralized"),),
    tensorflow_tape_fit="hvdx.strategies.decentralized.tape_fit:tape_fit",
    cost_model="decentralized",
    cost_layout="hvdx.strategies.decentralized.core_cost:_decentralized",
    # The exponential graphs: static, one-peer, and one-peer overlapped with the compute.
    cost_compared=({"graph": "static-exp"}, {"graph": "one-peer-exp"},
                   {"graph": "one-peer-exp", "order": "combine_then_adapt"}),
    state_exports=("hvdx.tensorflow.mixing_state:STATE_GETTERS.decentralized_state",),
    examples=("Decentralized(graph='one-peer-exp')",),
    bench=tuple(BenchVariant(name, "hvdx.strategies.decentralized.bench_rows:decentralized_strategy", kwargs,
                             default=not kwargs) for name, kwargs in (
        ("decentralized", {}), ("decentralized_static", {"graph": "static-exp"}),
        ("decentralized_cta", {"order": "combine_then_adapt"}))),
    soak="Decentralized(graph='one-peer-exp')",
    plan_line="hvdx.strategies.decentralized.plan_line:decentralized_line",
    plan_options=(PlanOption("--mix-every", int, "decentralized: mix every N steps, "
                             "local steps between", 1),))
