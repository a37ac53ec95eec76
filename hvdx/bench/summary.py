"""The bench's rows: one run's result reduced to a :class:`Summary`, and the columns
that compare rows (the speedup over Horovod, the multiple of the floor's step).

A row's mean step leaves out the first :data:`WARMUP_STEPS` and counts whole periods of
the strategy's schedule (:func:`mean_step`), as the plan prices it; its wait in hvdx's own
exchanges is the least over ranks (:func:`local_wait`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

from hvdx.bench.workloads import ACCURACY, Metric

__all__ = ["BYTES_TOLERANCE", "FLOOR", "Summary", "WARMUP_STEPS", "add_floor",
           "add_speedups", "local_wait", "mean_step", "summarize"]

#: The strategy with no communication at all (:data:`hvdx.bench.strategies.STRATEGIES`).
FLOOR = "floor"
#: Interface bytes per rank against hvdx's count: within this, the counts agree.
BYTES_TOLERANCE = 0.10
#: Steps left out of the mean step (connections are set up and buffers allocated then).
WARMUP_STEPS = 2


@dataclass
class Summary:
    """One row of the comparison table."""

    workload: str
    strategy: str
    network: str
    ranks: int
    steps: int
    median_step_s: float
    time_to_target_s: Optional[float]
    #: The workload's target and the last evaluation, in its metric's ``unit``.
    target: float
    final_quality: float
    hvdx_bytes_per_step: float
    hvdx_received_per_step: float
    interface_tx_per_step: Optional[float]
    interface_rx_per_step: Optional[float]
    step_speedup: Optional[float] = None
    target_speedup: Optional[float] = None
    #: The step as a multiple of the floor's (every rank training alone, no
    #: communication at all: the limit of any strategy on these cores); 1.00 is the floor.
    floor_multiple: Optional[float] = None
    predicted_step_s: Optional[float] = None
    #: The cost model's step from the configured rates alone (no calibration).
    uncalibrated_step_s: Optional[float] = None
    #: How ranks were placed on the emulated hosts (``None`` on localhost).
    placement: Optional[str] = None
    #: The mean step after the first :data:`WARMUP_STEPS`, over whole periods of the
    #: strategy's schedule (:func:`mean_step`): what the plan predicts.
    mean_step_s: Optional[float] = None
    #: Ranks that train on a batch each step (Stanza: its conv workers), from the plan:
    #: strategies are ranked by step time per batch, as ``hvdx plan`` ranks them.
    data_ranks: Optional[int] = None
    #: Of each step, the least mean time any rank spent waiting in hvdx's own exchanges
    #: (:func:`local_wait`): on localhost, ``hvdx plan --local-waits`` for this strategy.
    hvdx_wait_s: Optional[float] = None
    #: Of :attr:`predicted_step_s`, the compute (or the local step) the plan priced:
    #: the rest is wire (:func:`hvdx.core.cost.verdict.wire_share`).
    predicted_compute_s: Optional[float] = None
    #: The unit of :attr:`target` and :attr:`final_quality` (:class:`Metric`'s ``unit``).
    unit: str = "acc"

    @property
    def prediction_error(self) -> Optional[float]:
        """``hvdx plan``'s predicted step time against the measured mean step (0 = exact).

        The mean, not the median: the plan spreads a schedule's rare steps evenly over
        its period (DS-Sync: one crossing step in 17 at 20 Mbit, 4.8 s against 0.27 s),
        which a median leaves out entirely."""
        if self.predicted_step_s is None:
            return None
        measured = self.median_step_s if self.mean_step_s is None else self.mean_step_s
        return self.predicted_step_s / measured - 1.0

    @property
    def bytes_agreement(self) -> Optional[float]:
        """Bytes the emulated interface received over hvdx's count (1.0 = identical).

        Received, not sent: a shaped link drops packets when its queue is full and TCP
        sends them again, so the sender's counter also holds retransmissions.
        """
        if not self.interface_rx_per_step or not self.hvdx_received_per_step:
            return None
        return self.interface_rx_per_step / self.hvdx_received_per_step


def mean_step(step_times: List[float], period: int = 1) -> float:
    """The mean step after the first :data:`WARMUP_STEPS` (all of them if there are no
    more), over as many whole periods of the strategy's schedule as the run holds
    (``period``: the runner's ``schedule_period``): what the plan predicts, and the local
    step it adds the wire to.

    The plan spreads a schedule's rare steps over its period (DS-Sync's one crossing
    step in 17 at 20 Mbit); a window that cuts a period holds too many or too few of
    them (28 steps: one crossing in 28), and reads the schedule's mean wrong.
    """
    counted = step_times[WARMUP_STEPS:] if len(step_times) > WARMUP_STEPS else step_times
    whole = len(counted) // period * period
    return float(np.mean(counted[:whole] if whole else counted))


def summarize(result: Dict, target: float, network: str, metric: Metric = ACCURACY) -> Summary:
    """Reduce one runner result (see :mod:`hvdx.bench.runner`) to a table row."""
    reached = [p["time"] for p in result["curve"] if metric.reached(p["quality"], target)]
    detail = [r["interface_tx_rx"] for r in result["ranks_detail"] if r["interface_tx_rx"]]
    steps = result["steps"]
    tx = rx = None
    if detail and len(detail) == result["ranks"]:
        # Counters are per emulated host and cover the training loop only.
        tx = float(np.mean([d[0] for d in detail])) / steps
        rx = float(np.mean([d[1] for d in detail])) / steps
    return Summary(
        workload=result["workload"], strategy=result["strategy"], network=network,
        ranks=result["ranks"], steps=steps,
        median_step_s=float(np.median(result["step_times"])),
        mean_step_s=mean_step(result["step_times"], result.get("schedule_period", 1)),
        time_to_target_s=reached[0] if reached else None, target=target,
        final_quality=result["curve"][-1]["quality"], unit=metric.unit,
        hvdx_bytes_per_step=result["hvdx_bytes_per_rank_per_step"],
        hvdx_received_per_step=result.get("hvdx_received_per_rank_per_step",
                                          result["hvdx_bytes_per_rank_per_step"]),
        interface_tx_per_step=tx, interface_rx_per_step=rx,
        placement=result.get("placement"), hvdx_wait_s=local_wait(result))


def local_wait(result: Dict) -> Optional[float]:
    """The least, over ranks, of a rank's mean time per step in hvdx's MPI waits (over
    the steps :func:`mean_step` counts); ``None`` if the runner did not record them.

    The least, because the cluster's wire lengthens the step by what it takes beyond
    the waits of the rank that waits least."""
    waits = [r.get("step_waits") for r in result["ranks_detail"]]
    if not waits or any(w is None for w in waits):
        return None
    period = result.get("schedule_period", 1)
    return min(mean_step(w, period) for w in waits)


def add_speedups(rows: List[Summary]) -> None:
    """Against the (first) Horovod run of the same workload, whatever the placement."""
    for row in rows:
        base = next((r for r in rows if r.workload == row.workload
                     and r.strategy == "horovod"), None)
        if base is None:
            continue
        row.step_speedup = base.median_step_s / row.median_step_s
        if base.time_to_target_s and row.time_to_target_s:
            row.target_speedup = base.time_to_target_s / row.time_to_target_s


def add_floor(rows: List[Summary]) -> None:
    """Each step as a multiple of the floor run of the same workload, if there is one."""
    for row in rows:
        floor = next((r for r in rows if r.workload == row.workload
                      and r.strategy == FLOOR), None)
        if floor is not None:
            row.floor_multiple = row.median_step_s / floor.median_step_s

