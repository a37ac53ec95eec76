"""TopK's entry in the strategy catalogue (:data:`hvdx.strategies.catalogue.BUILT_IN`).

Its adapters are lazy paths ``"module:attribute"`` (:mod:`hvdx.strategies.descriptor`):
importing this module imports no framework.
"""

from hvdx.strategies.descriptor import BenchVariant, Constructor, PlanOption, StrategyDescriptor
from hvdx.strategies.topk.presets import PRESETS

__all__ = ["TOPK"]

TOPK = StrategyDescriptor(
    name="topk", kind="compression", title="TopK",
    # The presets are bare names for topk(preset=...): presets.PRESETS says
    # which there are, so a new preset needs no entry here.
    constructors=(Constructor("topk", "hvdx.strategies.topk.spec:topk"),) + tuple(
        Constructor(p, preset=p, calls="topk") for p in PRESETS),
    # Its adapters are the shared compression drivers'
    # (hvdx.strategies.descriptor.COMPRESSION_DRIVERS), which run this synchronizer.
    synchronizer="hvdx.strategies.topk.mpi_driver:TopKSynchronizer",
    torch_fit="hvdx.strategies.topk.torch_preset_fit:fit_preset",
    tensorflow_arguments="hvdx.strategies.topk.presets:tensorflow_arguments",
    cost_model="topk", cost_layout="hvdx.strategies.topk.core_cost:_topk",
    cost_compared=({"mode": "gathered"}, {"mode": "sharded"}),
    state_exports=("hvdx.tensorflow.compression_residuals:STATE_GETTERS.topk_state",),
    examples=("topk(0.01, 0.01)", "topk(preset='safe', downlink_ratio=0.05)"),
    bench=(BenchVariant("topk", "hvdx.strategies.topk.bench_rows:topk_strategy", default=False,
                        full=True),
           # Named as the presets are everywhere else; the names these rows had before
           # (results files, scripts) still select them.
           BenchVariant("fast", "hvdx.strategies.topk.bench_rows:topk_strategy",
                        {"preset": "fast"}, aliases=("topk_dgc",)),
           BenchVariant("safe", "hvdx.strategies.topk.bench_rows:topk_strategy",
                        {"preset": "safe"}, aliases=("topk_masked",))),
    soak="topk(0.01, 0.01)", plan_line="hvdx.strategies.topk.plan_line:topk_line",
    plan_options=(PlanOption("--ratio", float, "topk: uplink ratio", 0.01),
                  PlanOption("--downlink-ratio", float,
                             "topk sharded: downlink ratio (default: --ratio)")))
