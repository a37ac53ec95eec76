"""DS-Sync's entry in the strategy catalogue (:data:`hvdx.strategies.catalogue.BUILT_IN`).

Its mixer is :class:`hvdx.strategies.dssync.mixer.GroupMixer` (the spec's
``make_mixer``), which the shared mixing drivers run; its lazy paths ``"module:attribute"``
(:mod:`hvdx.strategies.descriptor`) import no framework.
"""

from hvdx.strategies.descriptor import BenchVariant, Constructor, PlanOption, StrategyDescriptor

__all__ = ["DSSYNC"]

DSSYNC = StrategyDescriptor(
    name="dssync", kind="sync", title="DS-Sync",
    constructors=(Constructor("DSSync", "hvdx.strategies.dssync.spec:DSSync"),),
    cost_model="dssync", cost_layout="hvdx.strategies.dssync.core_cost:_dssync",
    state_exports=("hvdx.tensorflow.mixing_state:STATE_GETTERS.dssync_state",),
    dynamic_process_sets=True,
    examples=("DSSync(intra_phases=4)",),
    torch_exports=("hvdx.strategies.dssync.mixer:dssync_process_sets",),
    tensorflow_exports=("hvdx.strategies.dssync.mixer:dssync_process_sets",),
    bench=(BenchVariant("dssync", "hvdx.strategies.dssync.bench_rows:dssync_strategy"),
           BenchVariant("dssync_adaptive", "hvdx.strategies.dssync.bench_rows:dssync_strategy",
                        {"adaptive": True}, default=False)),
    soak="DSSync('shuffle', group_size=2, seed=0)",
    plan_line="hvdx.strategies.dssync.plan_line:dssync_line",
    plan_options=(PlanOption("--intra-phases", int,
                             "dssync: intra-rack phases per cross-rack phase", 1),
                  PlanOption("--cross-ranks", int,
                             "dssync: ranks per rack in a cross phase (default: all)")))
