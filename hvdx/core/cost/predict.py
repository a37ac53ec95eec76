"""The cost model's API: one strategy's predicted step, several compared, and how far
a prediction is from a measurement (:mod:`hvdx.core.cost_model`).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from hvdx.core.cost.layouts import STRATEGIES, default_entries
from hvdx.core.cost.pricing import _price
from hvdx.core.cost.types import Cluster, Prediction, Workload
from hvdx.core.units import parse_time

#: What :func:`compare` prices by default (and ``hvdx plan``'s rows): Horovod's two
#: layouts, then every built-in strategy's entries from its descriptor's
#: ``cost_compared`` (both TopK modes; the exponential graphs, static, one-peer, and
#: one-peer overlapped with the compute), in catalogue order
#: (:func:`hvdx.core.cost.layouts.default_entries`).
DEFAULT_STRATEGIES = default_entries()


def _options_of(strategy: str) -> Tuple[str, ...]:
    return tuple(inspect.signature(STRATEGIES[strategy]).parameters)[2:]


def predict(strategy: str, cluster: Cluster, workload: Workload,
            local_step_s: Optional[float] = None, local_wait_s: Optional[float] = None,
            local_cores: Optional[int] = None, **options) -> Prediction:
    """Predicts one step of ``strategy`` on ``cluster``.

    Args:
        strategy: a key of :data:`STRATEGIES`.
        cluster: the network.
        workload: the model and its compute time.
        local_step_s: this strategy's step measured with every rank on one host, talking
            through shared memory (``hvdx bench`` measures it before its cluster runs).
            It replaces the modelled compute: it holds the compute, the strategy's own
            CPU work (TopK's selection and sums, Stanza's head for every conv worker),
            and what each of its collectives costs on these cores apart from the wire
            (the ranks' waits on each other), none of which the phases price; shared
            memory's own transfer time is small next to a cluster's (8 MiB: under 1 ms),
            so the phases are added whole. ``None``: the workload's compute.
        local_wait_s: of ``local_step_s``, the time per step that the rank waiting
            least spent in hvdx's own MPI waits (:func:`hvdx.mpi.sparse.waited_s`).
            With more ranks than cores the ranks reach each exchange in waves, one
            wave per ``local_cores`` ranks, and the earlier waves wait there while the
            last one computes (four ranks on two cores: every rank waited 25-50 ms of
            a TopK step). On the cluster the earlier waves' messages cross the wire
            during that wait; only the last wave's share, ``local_cores / ranks`` of
            the wire, surely comes after it. So the step is ``local_step_s + comm -
            min(local_wait_s, comm * (1 - local_cores / ranks))``
            (:attr:`Prediction.hidden_s`): on a flat cluster with 14 ms of priced
            wire, topk_dgc's cluster step was its local step (87 and 86 ms; 88 and 88
            ms), and topk_masked's, with 21 ms, 21 and 8 ms longer than its local step
            in two runs; hiding the whole wire put it 20% low, hiding none 16%
            high for topk_dgc. Needs ``local_step_s`` and ``local_cores``; not used
            where communication overlaps the compute (already ``max``).
        local_cores: the cores the local run's ranks shared (``hvdx bench``: this
            machine's); none hidden with at least one core per rank.
        **options: the strategy's options: topk ``ratio``, ``downlink_ratio``, ``mode``;
            dssync ``intra_phases``, ``cross_ranks``; decentralized ``graph``,
            ``order``, ``mix_every``; stanza ``fc_workers``.

    Raises:
        ValueError: for an unknown strategy, an option it does not take, or a bad value.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not one of {', '.join(STRATEGIES)}")
    unknown = sorted(set(options) - set(_options_of(strategy)))
    if unknown:
        raise ValueError(f"strategy {strategy!r} takes no option {', '.join(unknown)}; it "
                         f"takes: {', '.join(_options_of(strategy)) or 'none'}")
    if local_step_s is not None:
        local_step_s = parse_time(local_step_s, "local_step_s")
    if local_wait_s is not None:
        if local_step_s is None:
            raise ValueError(f"local_wait_s={local_wait_s!r} needs local_step_s: it is "
                             "the part of a measured local step spent waiting")
        local_wait_s = parse_time(local_wait_s, "local_wait_s")
        if local_wait_s > local_step_s:
            raise ValueError(f"local_wait_s={local_wait_s!r} is longer than "
                             f"local_step_s={local_step_s!r}, which holds it")
        if isinstance(local_cores, bool) or not isinstance(local_cores, int) or \
                local_cores < 1:
            raise ValueError(f"local_cores={local_cores!r} must be the number of cores "
                             "the local run's ranks shared (a whole number, at least 1), "
                             "given with local_wait_s")
    if local_step_s is None and cluster.calibration is not None and \
            cluster.calibration.local_set_allreduce_times:
        # Only a local step holds the one-host part of Horovod's averages: without one,
        # they are priced whole.
        cluster = dataclasses.replace(cluster, calibration=dataclasses.replace(
            cluster.calibration, local_set_allreduce_times={}))
    plan = STRATEGIES[strategy](cluster, workload, **options)
    phases = tuple(_price(t, cluster) for t in plan.traffic)
    per_link: Dict[str, float] = {}
    for p in phases:
        per_link[p.bottleneck] = per_link.get(p.bottleneck, 0.0) + p.weight * p.seconds
    comm = sum(per_link.values())
    compute = workload.compute_s if plan.compute_s is None else plan.compute_s
    hidden = 0.0
    if local_wait_s is not None and not plan.overlap:
        # The earlier waves' share of the wire, as far as the wait holds it.
        hidden = min(local_wait_s, comm * max(0.0, 1.0 - local_cores / cluster.ranks))
    return Prediction(
        strategy, plan.label, compute if local_step_s is None else local_step_s, comm,
        sum(p.weight * p.sent_bytes for p in phases),
        max(per_link, key=per_link.get) if comm > 0 else "none", phases,
        cluster.ranks if plan.data_ranks is None else plan.data_ranks, plan.overlap,
        hidden)


def compare(cluster: Cluster, workload: Workload,
            strategies: Sequence[Union[str, Tuple[str, Mapping]]] = DEFAULT_STRATEGIES,
            local_steps: Optional[Mapping[str, float]] = None,
            local_waits: Optional[Mapping[str, float]] = None,
            local_cores: Optional[int] = None, **options) -> List[Prediction]:
    """Predicts several strategies, fastest first (by time per batch trained).

    Args:
        strategies: keys, or ``(key, options)`` pairs whose options win over ``options``.
        local_steps: strategy key -> its measured local step (:func:`predict`'s
            ``local_step_s``), for every entry of that key; keys not given: none.
        local_waits: strategy key -> the wait in hvdx's exchanges that its local step
            holds (:func:`predict`'s ``local_wait_s``); keys not given: none.
        local_cores: the cores the local runs' ranks shared (:func:`predict`'s).
        **options: shared options; each strategy takes those it knows.

    Raises:
        ValueError: for an unknown strategy, here, in ``local_steps`` or in
            ``local_waits``, or a wait without a local step.
    """
    local_steps, local_waits = dict(local_steps or {}), dict(local_waits or {})
    for what, given in (("local_steps", local_steps), ("local_waits", local_waits)):
        for name in given:
            if name not in STRATEGIES:
                raise ValueError(f"{what} has strategy {name!r}, not one of "
                                 f"{', '.join(STRATEGIES)}")
    predictions = []
    for entry in strategies:
        name, own = (entry, {}) if isinstance(entry, str) else entry
        if name not in STRATEGIES:
            raise ValueError(f"strategy={name!r} is not one of {', '.join(STRATEGIES)}")
        merged = {k: v for k, v in options.items() if k in _options_of(name)}
        predictions.append(predict(name, cluster, workload, local_steps.get(name),
                                   local_waits.get(name), local_cores,
                                   **{**merged, **own}))
    return sorted(predictions, key=lambda p: p.seconds_per_batch)


def speedup(prediction: Prediction, baseline: Prediction) -> float:
    """How many times faster ``prediction`` trains a batch than ``baseline``."""
    return baseline.seconds_per_batch / prediction.seconds_per_batch


def speedup_over_horovod(prediction: Prediction, cluster: Cluster, workload: Workload) -> float:
    """:func:`speedup` against Horovod's flat ring on the same cluster and workload."""
    return speedup(prediction, predict("horovod", cluster, workload))


def prediction_error(predicted: Union[Prediction, float], measured: float) -> float:
    """Relative error ``(predicted - measured) / measured``; positive: the model is slow.

    Raises:
        ValueError: if ``measured`` is not a positive number of seconds.
    """
    if isinstance(measured, bool) or not isinstance(measured, (int, float)) or \
            not 0 < measured < math.inf:
        raise ValueError(f"measured={measured!r} must be a positive step time in seconds")
    value = predicted.step_s if isinstance(predicted, Prediction) else float(predicted)
    return (value - measured) / measured
