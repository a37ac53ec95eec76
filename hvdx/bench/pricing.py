"""The bench's ``plan`` column: every cluster run priced by the cost model
(:mod:`hvdx.core.cost_model`), from the cluster spec and the measured compute, with and
without the calibration measured on the cluster (:mod:`hvdx.mpi.calibrate`).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List

from hvdx.bench.strategies import STRATEGIES
from hvdx.bench.summary import FLOOR, Summary
from hvdx.bench.workloads import WORKLOADS

__all__ = ["add_predictions"]


def add_predictions(rows: List[Summary], raw: List[Dict], spec,
                     calibration=None) -> None:
    """Price every run with the cost model, from the cluster spec and measured compute:
    ``predicted_step_s`` from the calibration measured on the cluster when there is one
    (:mod:`hvdx.mpi.calibrate`), ``uncalibrated_step_s`` from the configured rates.

    With a calibration, the step without the cluster's wire is the strategy's own local
    run (every rank on this host through shared memory,
    :data:`~hvdx.bench.local_run.LOCAL_STEPS` steps:
    compute, the strategy's CPU work and its collectives' waits, with the time its ranks
    spent in hvdx's own exchanges, in which the wire can run) where there was one, else
    the floor's measured step of the same workload (every rank training alone on the same
    cores), else the runner's timed forward and backward pass."""
    from hvdx.core.cost_model import Cluster, Workload, predict

    if spec is None:
        return  # localhost: shared memory, nothing the model describes
    floors = {r.workload: r.median_step_s for r in rows if r.strategy == FLOOR}
    for row, result in zip(rows, raw):
        model_name = STRATEGIES[row.strategy].cost_model
        if model_name is None:
            continue
        layout = dict(racks=spec.racks, hosts_per_rack=spec.hosts_per_rack,
                      nic_bps=spec.nic, uplink_bps=spec.uplink,
                      ranks_per_host=result["ranks"] // spec.num_hosts,
                      placement=row.placement or "blocked")
        cluster = Cluster(**layout)
        conv, fc = result["parameter_split"]
        other = result["parameters"] - conv - fc  # batch norm and friends: in the body
        workload = Workload(conv_params=conv + other, fc_params=fc,
                            compute_s=result["compute_s"],
                            batch_size=WORKLOADS[row.workload].batch_size,
                            **(result.get("stanza") or {}))
        # What the run used (a DS-Sync rotation picks its parameters from the link rates).
        options = result.get("cost_options", STRATEGIES[row.strategy].cost_options)
        uncalibrated = predict(model_name, cluster, workload, **options)
        row.uncalibrated_step_s = uncalibrated.step_s
        row.predicted_step_s = row.uncalibrated_step_s
        row.predicted_compute_s = uncalibrated.compute_s
        row.data_ranks = uncalibrated.data_ranks
        if calibration is not None:
            if row.workload in floors:
                workload = dataclasses.replace(workload, compute_s=floors[row.workload])
            # Horovod's averages, where they were timed again around this run (run_bench).
            timed = dataclasses.replace(calibration, set_allreduce_times={
                **calibration.set_allreduce_times,
                **{g: [tuple(p) for p in points]
                   for g, points in (result.get("set_allreduce_times") or {}).items()}})
            # Sharded TopK's step, where it was timed again around this run (run_bench).
            if result.get("sharded_topk_times"):
                timed = dataclasses.replace(timed, sharded_topk_times={
                    float(m): [tuple(p) for p in points]
                    for m, points in result["sharded_topk_times"].items()})
            calibrated = predict(model_name, Cluster(**layout, calibration=timed),
                                 workload, result.get("local_step_s"),
                                 local_wait_s=result.get("local_wait_s"),
                                 local_cores=result.get("local_cores"), **options)
            row.predicted_step_s = calibrated.step_s
            row.predicted_compute_s = calibrated.compute_s

