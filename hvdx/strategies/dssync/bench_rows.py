"""DS-Sync's rows of ``hvdx bench``'s table (its descriptor's ``bench``): the rotation
with its default parameters (row ``dssync``), and the rotation re-planned from a
bandwidth probe (row ``dssync_adaptive``, run when named). torch is imported inside the
builders, on the ranks that train.
"""

from __future__ import annotations

from typing import Dict

from hvdx.bench.run_environment import bench_topology
from hvdx.bench.strategy_row import BenchRow, call

__all__ = ["DSSYNC_ADAPTIVE_OPTIONS", "DSSYNC_OPTIONS", "dssync_strategy"]


#: The benchmark's DS-Sync: the rotation with its default parameters, which the cost of
#: crossing sets from the link rates the emulated cluster exports
#: (``HVDX_CLUSTER_LINK_RATES``): with 1 Gbit NICs and a 100 Mbit uplink on 2 racks x 2
#: hosts, 10 intra-rack phases per cross phase, one rank per rack crossing.
DSSYNC_OPTIONS: Dict = {}


def _dssync_with(options: Dict):
    def build(optimizer, model):
        import hvdx
        import hvdx.torch as hvd

        sync = hvdx.DSSync(**dict(options, topology=bench_topology()))
        return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                        sync=sync)
    return build


_dssync = _dssync_with(DSSYNC_OPTIONS)


#: The adaptive variant: the same rotation, re-planned from the bandwidth probe every
#: ``probe_every`` steps (1 MiB per transfer: about 1 s per probe over a 100mbit
#: uplink on 2 x 2 hosts, counted in the step times).
DSSYNC_ADAPTIVE_OPTIONS = dict(DSSYNC_OPTIONS, probe_every=10, probe_bytes=2**20)


_dssync_adaptive = _dssync_with(DSSYNC_ADAPTIVE_OPTIONS)


def _rotation_options(optimizer) -> Dict:
    """The cost model's options for the rotation the run actually used."""
    schedule = optimizer.hvdx_groups.schedule
    return {"intra_phases": schedule.intra_phases, "cross_ranks": schedule.cross_ranks}


def _rotation_period(optimizer) -> int:
    """The rotation's period: ``intra_phases`` intra-rack steps and one crossing step
    (:class:`hvdx.strategies.dssync.core_schedule.RotationSchedule`)."""
    return optimizer.hvdx_groups.schedule.period


def _dssync_bytes(optimizer, model, size, steps):
    """The ring model inside each step's group (hvdx hands the groups to Horovod)."""
    each_way = optimizer.hvdx_stats.total_bytes / steps
    return each_way, each_way


def dssync_strategy(name: str, adaptive: bool = False) -> BenchRow:
    """A DS-Sync row: the rotation with :data:`DSSYNC_OPTIONS`, or re-planned from the
    probe (:data:`DSSYNC_ADAPTIVE_OPTIONS`)."""
    options = DSSYNC_ADAPTIVE_OPTIONS if adaptive else DSSYNC_OPTIONS
    label = (f"DS-Sync rotation, re-planned from a bandwidth probe every "
             f"{options['probe_every']} steps" if adaptive else
             "DS-Sync rotation, parameters from the cost of crossing")
    return BenchRow(name, label, _dssync_adaptive if adaptive else _dssync, _dssync_bytes,
                    cost_model="dssync", cost_options_of=_rotation_options,
                    period_of=_rotation_period, init_kwargs={"process_sets": "dynamic"},
                    script_env={"HVDX_SYNC": call("DSSync", options)})
