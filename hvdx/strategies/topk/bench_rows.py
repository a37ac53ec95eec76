"""TopK's rows of ``hvdx bench``'s table (its descriptor's ``bench``): the bench's own
setting, 1% both ways with the presets' selector (row ``topk``, run by ``--full``), and
the presets ``fast`` and ``safe`` (:mod:`hvdx.strategies.topk.presets`). torch is
imported inside the builders, on the ranks that train.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

from hvdx.bench.strategy_row import BenchRow, call, counted_bytes
from hvdx.strategies.topk import presets as topk_presets

__all__ = ["TOPK_DGC_OPTIONS", "TOPK_MASKED_OPTIONS", "TOPK_METHOD", "TOPK_RATIO",
           "topk_strategy"]


#: The benchmark's TopK setting: 1% both ways, with the sampled-threshold
#: ``topk_method`` of the presets (:mod:`hvdx.strategies.topk.presets`).
TOPK_RATIO = topk_presets.RATIO
TOPK_METHOD = topk_presets.TOPK_METHOD
#: The tuned TopKs are the presets ``Compression.topk(preset="fast")`` (row ``fast``,
#: once ``topk_dgc``: global selection, DGC momentum correction without masking) and
#: ``preset="safe"`` (row ``safe``, once ``topk_masked``: with masking, the downlink
#: twice as dense); the measurements behind them are in
#: :mod:`hvdx.strategies.topk.presets`. Their arguments, for the labels and the cost model:
TOPK_DGC_OPTIONS: Dict = topk_presets.preset_options("fast")
TOPK_MASKED_OPTIONS: Dict = topk_presets.preset_options("safe")
#: Every run of the bench, Horovod's included, keeps Horovod's defaults: no strategy
#: gets a tuning the baseline does not. (The tuned TopKs, decentralized SGD and Stanza
#: leave Horovod idle during a step, so a user may launch them with
#: ``HOROVOD_CYCLE_TIME=50``, :data:`hvdx.strategies.topk.presets.HOROVOD_CYCLE_ENV`, for
#: a few more percent: docs/benchmarks.md, "TopK: Horovod's cycle".)


def _topk_with(**options):
    """The builder of a TopK strategy: ``Compression.topk(ratio=TOPK_RATIO,
    topk_method=TOPK_METHOD, **options)``."""
    def build(optimizer, model):
        import hvdx.torch as hvd

        return hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(),
            compression=hvd.Compression.topk(ratio=TOPK_RATIO, topk_method=TOPK_METHOD,
                                             **options))
    return build


def _topk_preset(preset: str):
    """The builder of a tuned TopK strategy: ``Compression.topk(preset=preset)``."""
    def build(optimizer, model):
        import hvdx.torch as hvd

        return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                        compression=hvd.Compression.topk(preset=preset))
    return build


def topk_strategy(name: str, preset: Optional[str] = None) -> BenchRow:
    """A TopK row: the bench's own setting (:data:`TOPK_RATIO` both ways,
    :data:`TOPK_METHOD`), or a preset's (``HVDX_COMPRESSION=<preset>``)."""
    sharded = {"mode": "sharded"}
    if preset is None:
        return BenchRow(
            name, f"bidirectional TopK {TOPK_RATIO:g}/{TOPK_RATIO:g} with error feedback, "
            f"{TOPK_METHOD} selector", _topk_with(downlink_ratio=TOPK_RATIO), counted_bytes,
            cost_model="topk",
            cost_options=dict(ratio=TOPK_RATIO, downlink_ratio=TOPK_RATIO, **sharded),
            script_env={"HVDX_COMPRESSION": call("topk", {"ratio": TOPK_RATIO,
                                                           "topk_method": TOPK_METHOD,
                                                           "downlink_ratio": TOPK_RATIO})})
    options = topk_presets.preset_options(preset)
    up, down = options["ratio"], options["downlink_ratio"]
    ratios = f"{up:g}/{down:g}," if up == down else f"{up:g} up, {down:g} down,"
    masking = "with" if options["momentum_masking"] else "without"
    adaptive = topk_presets.ADAPTIVE_RATIO
    return BenchRow(name, f"bidirectional TopK {ratios} global selection, DGC momentum "
                    f"correction {masking} masking, small tensors averaged by hvdx "
                    f"({adaptive:g} both ways under Adam's family)",
                    _topk_preset(preset), counted_bytes, cost_model="topk",
                    cost_options=dict(ratio=up, downlink_ratio=down, **sharded),
                    cost_options_of=_preset_options, script_env={"HVDX_COMPRESSION": preset},
                    settings_on=_preset_settings(preset))


def _preset_settings(preset: str) -> Callable:
    """(workload) -> the TopK spec ``preset`` runs with under the workload's optimizer
    (:func:`hvdx.strategies.topk.presets.for_optimizer`): under Adam's family both
    presets send :data:`~hvdx.strategies.topk.presets.ADAPTIVE_RATIO` both ways, one
    setting."""
    def settings(workload):
        import torch
        from hvdx.strategies.topk.spec import topk

        optimizer = workload.make_optimizer([torch.nn.Parameter(torch.zeros(1))], 1)
        fitted, _ = topk_presets.for_optimizer(topk(preset=preset), type(optimizer).__name__,
                                               optimizer.param_groups)
        return fitted
    return settings


def _preset_options(optimizer) -> Dict:
    """The cost model's options for the ratios the preset ran with: its own, or those it
    took for the workload's optimizer (:func:`hvdx.strategies.topk.presets.for_optimizer`)."""
    spec = optimizer.hvdx_strategy  # the spec as fitted to the optimizer
    return {"ratio": spec.ratio, "downlink_ratio": spec.downlink_ratio, "mode": "sharded"}
