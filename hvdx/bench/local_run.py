"""Each priced strategy's local run: its step with every rank on this host, talking
through shared memory, which the calibrated plan adds the cluster's wire to
(:func:`hvdx.bench.pricing.add_predictions`).

:data:`LOCAL_STEPS` says why the local run comes right before the strategy's cluster
run, and, in a full run, again right after it (:func:`add_local_runs` records the two
and their mean).
"""

from __future__ import annotations

import os
from typing import Dict, List, NamedTuple, Optional

from hvdx.bench import strategy_run
from hvdx.bench.summary import local_wait, mean_step
from hvdx.info import usable_cores

__all__ = ["LOCAL_STEPS", "LocalRun", "add_local_runs", "local_step"]

#: Steps of each strategy's local run (every rank on this host, shared memory), whose
#: mean step after :data:`~hvdx.bench.summary.WARMUP_STEPS` the calibrated plan takes as
#: the strategy's step without the cluster's wire
#: (:func:`hvdx.core.cost_model.predict`'s ``local_step_s``). Steps on 2 shared cores
#: vary by a quarter around their mean: 20 steps left the median of TopK's local step
#: 20% apart between two runs. Each local run comes right before the strategy's cluster
#: run: the machine's speed drifts by a third over minutes (Horovod's local step read
#: 150, 129 and 91 ms in three benches), and a local step timed minutes before its
#: cluster run had drifted away from it. In a full run (``--full``), a second local run
#: right after the cluster run brackets it, and the plan takes the mean of the two: a
#: drift over the minute of the cluster run then cancels (one local run alone put
#: topk_dgc's step 12% above topk_masked's, whose step does the same and more). As many
#: steps as a cluster run of the built-in workloads takes by default, so that the local
#: mean averages over as long a stretch of the machine's speed as the mean it prices:
#: with 40 steps (5 s of TopK), the two local runs around one flat cluster run read 136
#: and 158 ms, and TopK's 98 cluster steps between them 129.
#: A quick run's local runs take as many steps as its cluster runs.
LOCAL_STEPS = 100


class LocalRun(NamedTuple):
    """A strategy's local run (:func:`local_step`): its mean step, the least mean time
    any rank spent in hvdx's own MPI waits in a step (None: the run did not say), and
    the cores its ranks shared."""

    step_s: float
    wait_s: Optional[float] = None
    cores: Optional[int] = None


def local_step(workload: str, strategy: str, out_dir: str, ranks: int, timeout: float,
               say, spec=None, ranks_per_host: int = 1,
               steps: int = LOCAL_STEPS) -> Optional[LocalRun]:
    """The strategy's mean step after :data:`~hvdx.bench.summary.WARMUP_STEPS` with
    every rank on this host, talking through shared memory, ``steps`` steps
    (:data:`LOCAL_STEPS` in a full run, as many as the cluster run in a quick one), and
    its ranks' waits (:func:`~hvdx.bench.summary.local_wait`): the step the calibrated
    plan adds the cluster's wire to (:func:`~hvdx.bench.pricing.add_predictions`). A run
    that fails is said and gives ``None`` (the plan then takes the floor's step).

    The ranks are told the emulated cluster ``spec`` they stand in for (its topology and
    link rates), so that DS-Sync runs the cluster's rotation, with the cluster's groups
    and Horovod process sets (whose table slows every Horovod collective), not one
    host's."""
    from hvdx.bench.run_environment import TOPOLOGY_ENV
    from hvdx.cluster.launch import link_rates_value

    local_dir = os.path.join(out_dir, "local")
    os.makedirs(local_dir, exist_ok=True)
    env = None if spec is None else {
        TOPOLOGY_ENV: f"{spec.racks}x{spec.hosts_per_rack}x{ranks_per_host}",
        "HVDX_CLUSTER_LINK_RATES": link_rates_value(spec)}
    try:
        result = strategy_run.run_one(None, workload, strategy, steps, steps, local_dir,
                                      ranks, 1, timeout, lambda line: None, env=env)
    except RuntimeError as error:
        say(f"  {workload} / {strategy}: the local run failed "
            f"({str(error).splitlines()[0]}); its plan takes the floor's step")
        return None
    step = mean_step(result["step_times"], result.get("schedule_period", 1))
    wait = local_wait(result)
    waited = "" if not wait else f", {wait * 1e3:.1f} ms of it waiting in hvdx's exchanges"
    say(f"  {workload} / {strategy}: local step {step * 1e3:.1f} ms{waited} ({steps} "
        "steps, every rank on this host)")
    return LocalRun(step, wait, usable_cores())


def add_local_runs(result: Dict, runs: List[LocalRun]) -> None:
    """Record a run's local runs in its result, and their means: the step and the wait
    the plan prices it from (:func:`~hvdx.bench.pricing.add_predictions`); a wait only
    if every run had one."""
    result["local_steps_s"] = [r.step_s for r in runs]
    result["local_step_s"] = sum(result["local_steps_s"]) / len(runs)
    waits = [r.wait_s for r in runs if r.wait_s is not None]
    if len(waits) == len(runs) and runs[0].cores:
        result["local_waits_s"] = waits
        result["local_wait_s"] = sum(waits) / len(waits)
        result["local_cores"] = runs[0].cores


