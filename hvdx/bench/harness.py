"""``hvdx bench``: every strategy on the same cluster, in the same run, against Horovod.

Steps:
1. build the emulated cluster (:mod:`hvdx.cluster`; without root or network
   namespaces, plain localhost, labelled as such: no link is then a bottleneck);
2. for each workload, run Horovod's ring allreduce first, then the floor (every rank
   trains alone with the same placement on the same cores: no communication at all,
   the limit of any strategy), then every other strategy, each as an MPI job of
   :mod:`hvdx.bench.runner`, relaying its progress; with several rank placements
   (``--placement blocked,interleaved``), Horovod and the floor run under the first
   only and every other strategy under each
   (:func:`~hvdx.bench.strategy_run.placement_hosts`);
3. summarise each run: median step time and its multiple of the floor's, time to the
   workload's target quality (test accuracy; bits per byte for ``lm``), final quality,
   bytes sent per rank per step by hvdx's
   count and by the interface counters of the emulated hosts, and the speedups over
   the Horovod run;
4. write ``results.json``, ``results.csv`` and ``results.png`` (quality against
   training time, and step-time bars), and print the table.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, List, Optional

# Modules whose functions run_bench calls as ``module.name``, looked up at each call,
# so that a stand-in set on the module reaches it.
from hvdx.bench import calibration_jobs, local_run, pricing, results, strategy_run
from hvdx.bench.local_run import LOCAL_STEPS, LocalRun
from hvdx.bench.progress import TimeLeft, format_duration
from hvdx.bench.run_list import check_placements, ordered_runs, same_settings, with_data
from hvdx.bench.strategies import STRATEGIES
from hvdx.bench.summary import add_floor, add_speedups, summarize
from hvdx.bench.time_estimates import CALIBRATION_ESTIMATE_S, run_estimate_s
from hvdx.bench.workloads import WORKLOADS, check_workloads

__all__ = ["run_bench"]


def run_bench(spec, workloads: List[str], strategies: List[str], steps: Optional[int],
              eval_every: int, out_dir: str, ranks_per_host: int = 1,
              localhost_ranks: int = 4, timeout: float = 900.0,
              say: Callable[[str], None] = print,
              placements: Optional[List[str]] = None, floor: bool = True,
              calibrate: bool = True, full: bool = False):
    """Run every strategy on every workload (and rank placement), and the floor (every
    rank training alone) unless ``floor`` is false; on an emulated cluster, unless
    ``calibrate`` is false, first the calibration job (:mod:`hvdx.mpi.calibrate`), whose
    measurements price the ``plan`` column, right before each priced strategy's first
    run its local step (:func:`~hvdx.bench.local_run.local_step`), and, with ``full``,
    its local step again right after that run and, before and after each run, the
    collectives it is priced by that drift with the machine
    (:func:`~hvdx.bench.calibration_jobs.retiming`); write and return the summaries.

    Without ``full`` the run is the quick one ``bash scripts/main`` starts with: the
    calibration is minutes old at every run, so nothing is timed again, and one local
    run per strategy prices it (:data:`~hvdx.bench.local_run.LOCAL_STEPS` explains what
    a second one adds)."""
    check_workloads(workloads)
    for item in strategies:
        if item not in STRATEGIES:
            raise ValueError(f"strategy={item!r} is unknown; choose from {sorted(STRATEGIES)}")
    workloads = with_data(workloads, say)
    placements = check_placements(placements or ["blocked"])
    os.makedirs(out_dir, exist_ok=True)
    cluster, network = strategy_run.start_cluster(spec, say)
    cluster_used = cluster is not None
    if not cluster_used and len(placements) > 1:
        say(f"localhost: one host, so placements {', '.join(placements[1:])} are the same "
            "run; running one")
        placements = placements[:1]
    runs = ordered_runs(strategies, placements, floor)
    ranks = localhost_ranks if cluster is None else len(cluster.hosts) * ranks_per_host
    rows, raw = [], []
    calibration = None
    try:
        # (workload, strategy) -> its local run before its first cluster run, and
        # [before, after] with the one after it.
        local_steps: Dict[tuple, Optional[LocalRun]] = {}
        bracketed: Dict[tuple, List[LocalRun]] = {}
        priced = cluster_used and calibrate
        repeated = same_settings(workloads, strategies)
        skipped = {(w, s) for w in workloads for s in strategies
                   if s in WORKLOADS[w].does_not_apply or (w, s) in repeated}
        left = TimeLeft(([CALIBRATION_ESTIMATE_S] if priced else []) +
                        [run_estimate_s(spec if cluster_used else None, w, s,
                                         steps or WORKLOADS[w].steps(full), ranks, priced,
                                         full)
                         for w in workloads for s, _ in runs if (w, s) not in skipped])
        if priced:
            left.start()
            calibration = calibration_jobs.calibrate(
                cluster, ranks_per_host, out_dir, timeout, say,
                [calibration_jobs.model_bytes(w) for w in workloads])
            left.finish()
        total = sum((w, s) not in skipped for w in workloads for s, _ in runs)
        for w in workloads:
            # A quick run's local runs take as many steps as its cluster runs (see
            # LOCAL_STEPS).
            local_count = LOCAL_STEPS if full else (steps or WORKLOADS[w].steps(full))
            for s, placement in runs:
                if s in WORKLOADS[w].does_not_apply:
                    say(f"{w} with {STRATEGIES[s].label}: does not apply "
                        f"({WORKLOADS[w].does_not_apply[s]})")
                    continue
                if (w, s) in repeated:
                    say(f"{w} with {STRATEGIES[s].label}: the settings of "
                        f"{repeated[w, s][0]} here, run once (its row)")
                    continue
                where = f"{network}, {placement} placement" if cluster_used else network
                say(f"[{len(raw) + 1}/{total}, {left.line()}] {w} with "
                    f"{STRATEGIES[s].label} on {where}")
                left.start()
                if priced and STRATEGIES[s].cost_model is not None and \
                        (w, s) not in local_steps:
                    # Just before the cluster run, so that both meet the machine in the
                    # same state (see LOCAL_STEPS).
                    local_steps[w, s] = local_run.local_step(
                        w, s, out_dir, ranks, timeout, say, spec, ranks_per_host,
                        local_count)
                # The collectives the plan prices the run by, timed again around it.
                retime = calibration_jobs.retiming(w, s, calibration) \
                    if priced and full else None
                again = [retime(cluster, ranks_per_host, out_dir, timeout, say)] \
                    if retime else []
                result = strategy_run.run_one(
                    cluster, w, s, steps or WORKLOADS[w].steps(full), eval_every, out_dir,
                    ranks, ranks_per_host, timeout, say, placement=placement)
                if retime:
                    again.append(retime(cluster, ranks_per_host, out_dir, timeout, say))
                    timed = calibration_jobs.mean_times([a for a in again if a is not None])
                    if timed:
                        result[retime.field] = timed
                if local_steps.get((w, s)) is not None and (w, s) not in bracketed:
                    # And, in a full run, just after it, once per strategy (see
                    # LOCAL_STEPS).
                    after = local_run.local_step(
                        w, s, out_dir, ranks, timeout, say, spec, ranks_per_host,
                        local_count) if full else None
                    bracketed[w, s] = [local_steps[w, s]] + ([] if after is None
                                                             else [after])
                if (w, s) in bracketed:
                    local_run.add_local_runs(result, bracketed[w, s])
                raw.append(result)
                rows.append(summarize(result, WORKLOADS[w].target, network,
                                      WORKLOADS[w].metric))
                left.finish()
        say(f"done in {format_duration(left.elapsed_s())}")
    finally:
        if cluster is not None:
            cluster.close()
    add_speedups(rows)
    add_floor(rows)
    pricing.add_predictions(rows, raw, spec if cluster_used else None, calibration)
    results.write(rows, raw, out_dir)
    return rows

