"""A priori seconds of the bench's stages, for the first estimate of the time left
(:class:`hvdx.bench.progress.TimeLeft` corrects them as stages finish).
"""

from __future__ import annotations

from hvdx.bench.local_run import LOCAL_STEPS
from hvdx.bench.strategies import STRATEGIES
from hvdx.bench.workloads import WORKLOADS

__all__ = ["CALIBRATION_ESTIMATE_S", "LAUNCH_ESTIMATE_S", "LOCAL_STEP_ESTIMATE_S",
           "run_estimate_s"]

#: A priori seconds of the calibration job (about three minutes on 2 cores for 2x2
#: hosts), of launching one MPI job of the bench (importing torch and Horovod on every
#: rank), and of one training step on every rank of one host, for the first estimate of
#: the time left (:class:`hvdx.bench.progress.TimeLeft` corrects them as stages finish).
CALIBRATION_ESTIMATE_S = 180.0
LAUNCH_ESTIMATE_S = 12.0
LOCAL_STEP_ESTIMATE_S = 0.1


def run_estimate_s(spec, workload: str, strategy: str, steps: int, ranks: int,
                    priced: bool, full: bool = False) -> float:
    """A priori seconds of one strategy's turn: its cluster run (steps at the step the
    cost model gives on the configured rates, ``LOCAL_STEP_ESTIMATE_S`` of compute),
    and, where the plan is priced, its local run (two with ``full``)."""
    from hvdx.bench.workloads import parameter_split
    from hvdx.core.cost_model import Cluster, Workload, predict

    model = STRATEGIES[strategy].cost_model
    step = LOCAL_STEP_ESTIMATE_S
    if spec is not None and model is not None:
        conv, fc = parameter_split(WORKLOADS[workload].make_model())
        cluster = Cluster(racks=spec.racks, hosts_per_rack=spec.hosts_per_rack,
                          nic_bps=spec.nic, uplink_bps=spec.uplink,
                          ranks_per_host=max(1, ranks // spec.num_hosts))
        step = predict(model, cluster, Workload(conv_params=conv, fc_params=max(fc, 1),
                                                compute_s=LOCAL_STEP_ESTIMATE_S),
                       **STRATEGIES[strategy].cost_options).step_s
    jobs, local = 1, 0.0
    if priced and model is not None:
        runs = 2 if full else 1
        jobs += runs  # (the collectives timed again are short: the pace absorbs them)
        local = runs * (LOCAL_STEPS if full else steps) * LOCAL_STEP_ESTIMATE_S
    return jobs * LAUNCH_ESTIMATE_S + steps * step + local

