"""DS-Sync's entry in the strategy catalogue (:data:`hvdx.strategies.catalogue.BUILT_IN`).

Its adapters are lazy paths ``"module:attribute"`` (:mod:`hvdx.strategies.descriptor`):
importing this module imports no framework.
"""

from hvdx.strategies.descriptor import BenchVariant, Constructor, PlanOption, StrategyDescriptor

__all__ = ["DSSYNC"]

DSSYNC = StrategyDescriptor(
    name="dssync", kind="sync", title="DS-Sync",
    constructors=(Constructor("DSSync", "hvdx.strategies.dssync.spec:DSSync"),),
    torch_adapter="hvdx.strategies.dssync.torch.optimizer:adapter",
    tensorflow_tape="hvdx.strategies.dssync.tensorflow.adapters:tape_adapter",
    tensorflow_keras="hvdx.strategies.dssync.tensorflow.adapters:keras_adapter",
    tensorflow_tape_counters="hvdx.tensorflow.mixing:tape_counters",
    cost_model="dssync", cost_layout="hvdx.strategies.dssync.core_cost:_dssync",
    state_exports=("hvdx.strategies.dssync.tensorflow.adapters:dssync_state",),
    dynamic_process_sets=True,
    examples=("DSSync(intra_phases=4)",),
    torch_exports=("hvdx.strategies.dssync.torch.optimizer:dssync_process_sets",),
    tensorflow_exports=("hvdx.strategies.dssync.tensorflow.adapters:dssync_process_sets",),
    bench=(BenchVariant("dssync", "hvdx.bench.strategies:dssync_strategy"),
           BenchVariant("dssync_adaptive", "hvdx.bench.strategies:dssync_strategy",
                        {"adaptive": True}, default=False)),
    soak="DSSync('shuffle', group_size=2, seed=0)",
    plan_line="hvdx.planning.run_lines:dssync_line",
    plan_options=(PlanOption("--intra-phases", int,
                             "dssync: intra-rack phases per cross-rack phase", 1),
                  PlanOption("--cross-ranks", int,
                             "dssync: ranks per rack in a cross phase (default: all)")))
