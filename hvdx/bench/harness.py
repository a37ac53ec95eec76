"""``hvdx bench``: every strategy on the same cluster, in the same run, against Horovod.

Steps:
1. build the emulated cluster (:mod:`hvdx.cluster`; without root or network
   namespaces, plain localhost, labelled as such: no link is then a bottleneck);
2. for each workload, run Horovod's ring allreduce first, then the floor (every rank
   trains alone with the same placement on the same cores: no communication at all,
   the limit of any strategy), then every other strategy, each as an MPI job of
   :mod:`hvdx.bench.runner`, relaying its progress; with several rank placements
   (``--placement blocked,interleaved``), Horovod and the floor run under the first
   only and every other strategy under each (:func:`placement_hosts`);
3. summarise each run: median step time and its multiple of the floor's, time to the
   workload's target quality (test accuracy; bits per byte for ``lm``), final quality,
   bytes sent per rank per step by hvdx's
   count and by the interface counters of the emulated hosts, and the speedups over
   the Horovod run;
4. write ``results.json``, ``results.csv`` and ``results.png`` (quality against
   training time, and step-time bars), and print the table.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from hvdx.bench.progress import TimeLeft, format_duration
from hvdx.bench.strategies import STRATEGIES
from hvdx.bench.workloads import ACCURACY, WORKLOADS, Metric, check_workloads
from hvdx.core.cost.verdict import PLAN_TOLERANCE, compute_bound, tied
from hvdx.info import usable_cores

__all__ = ["Summary", "fastest_lines", "mean_step", "not_applicable", "placement_hosts",
           "render_table", "run_bench", "summarize"]

#: The strategy with no communication at all (:data:`hvdx.bench.strategies.STRATEGIES`).
FLOOR = "floor"
#: Interface bytes per rank against hvdx's count: within this, the counts agree.
BYTES_TOLERANCE = 0.10
#: Seconds a job may take to exit after its result is written. Its ranks finalize MPI
#: through :func:`hvdx.mpi.finalize.finalize`, which removed the known cause of jobs that
#: never exited (MPICH's own MPI_Finalize deadlocking over UCX's TCP transport); should
#: one still hang, the result is complete by then, so it is killed, and said.
EXIT_GRACE_S = 30.0
#: Steps left out of the mean step (connections are set up and buffers allocated then).
WARMUP_STEPS = 2
#: Steps of each strategy's local run (every rank on this host, shared memory), whose
#: mean step after :data:`WARMUP_STEPS` the calibrated plan takes as the strategy's step
#: without the cluster's wire (:func:`hvdx.core.cost_model.predict`'s ``local_step_s``).
#: Steps on 2 shared cores vary by a quarter around their mean: 20 steps left the
#: median of TopK's local step 20% apart between two runs. Each local run comes right
#: before the strategy's cluster run: the machine's speed drifts by a third over
#: minutes (Horovod's local step read 150, 129 and 91 ms in three benches),
#: and a local step timed minutes before its cluster run had drifted away from it.
#: In a full run (``--full``), a second local run right after the cluster run brackets it, and the plan takes the
#: mean of the two: a drift over the minute of the cluster run then cancels (one local
#: run alone put topk_dgc's step 12% above topk_masked's, whose step does the same and
#: more). As many steps as a cluster run of the built-in workloads takes by default, so
#: that the local mean averages over as long a stretch of the machine's speed as the
#: mean it prices: with 40 steps (5 s of TopK), the two local runs around one flat
#: cluster run read 136 and 158 ms, and TopK's 98 cluster steps between them 129.
#: A quick run's local runs take as many steps as its cluster runs.
LOCAL_STEPS = 100


class LocalRun(NamedTuple):
    """A strategy's local run (:func:`_local_step`): its mean step, the least mean time
    any rank spent in hvdx's own MPI waits in a step (None: the run did not say), and
    the cores its ranks shared."""

    step_s: float
    wait_s: Optional[float] = None
    cores: Optional[int] = None


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


def _add_predictions(rows: List[Summary], raw: List[Dict], spec,
                     calibration=None) -> None:
    """Price every run with the cost model, from the cluster spec and measured compute:
    ``predicted_step_s`` from the calibration measured on the cluster when there is one
    (:mod:`hvdx.mpi.calibrate`), ``uncalibrated_step_s`` from the configured rates.

    With a calibration, the step without the cluster's wire is the strategy's own local
    run (every rank on this host through shared memory, :data:`LOCAL_STEPS` steps:
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


def _add_speedups(rows: List[Summary]) -> None:
    """Against the (first) Horovod run of the same workload, whatever the placement."""
    for row in rows:
        base = next((r for r in rows if r.workload == row.workload
                     and r.strategy == "horovod"), None)
        if base is None:
            continue
        row.step_speedup = base.median_step_s / row.median_step_s
        if base.time_to_target_s and row.time_to_target_s:
            row.target_speedup = base.time_to_target_s / row.time_to_target_s


def _add_floor(rows: List[Summary]) -> None:
    """Each step as a multiple of the floor run of the same workload, if there is one."""
    for row in rows:
        floor = next((r for r in rows if r.workload == row.workload
                      and r.strategy == FLOOR), None)
        if floor is not None:
            row.floor_multiple = row.median_step_s / floor.median_step_s


def placement_hosts(spec, placement: str) -> List[int]:
    """The emulated hosts (indices ``h<i>``, numbered rack by rack) in the order ranks
    fill them, ``ranks_per_host`` each (Hydra's ``-hosts`` order):
    :func:`hvdx.core.cost_model.host_order`.

    With one rank per host, ``blocked`` puts rank ``r`` on host ``r`` (ranks ``0..H-1``
    in rack 0); ``interleaved`` puts it in rack ``r mod racks``, so that a hop of distance
    ``d`` leaves its rack only if ``racks`` does not divide ``d``.
    """
    from hvdx.core.cost_model import host_order

    return host_order(placement, spec.racks, spec.hosts_per_rack)


def _launch_command(cluster, ranks_per_host: int, argv: List[str], ranks: int,
                    strategy_env: Dict[str, str], placement: str = "blocked"):
    from hvdx.bench import pinning

    # Every rank on one core of this machine (:mod:`hvdx.bench.pinning`): with ranks
    # outnumbering the cores, the scheduler alone made the same run's step vary 2.5x.
    argv = pinning.command(argv)
    env = {"OMP_NUM_THREADS": "1", pinning.PIN_ENV: pinning.cores_value(), **strategy_env}
    if cluster is None:
        return ["mpirun", "-n", str(ranks)] + argv, env
    from hvdx.bench.run_environment import IFACE_ENV, PLACEMENT_ENV
    from hvdx.cluster import DATA_IFACE, mpiexec_command

    env[IFACE_ENV] = DATA_IFACE
    env[PLACEMENT_ENV] = placement
    return mpiexec_command(cluster, argv, hosts=placement_hosts(cluster.spec, placement),
                           ppn=ranks_per_host, env=env), {}


def _run_name(workload: str, strategy: str, placement: Optional[str]) -> str:
    """The file name stem of one run: ``digits_vgg-horovod``, or with a placement other
    than blocked, ``digits_vgg-decentralized-interleaved``."""
    suffix = f"-{placement}" if placement not in (None, "blocked") else ""
    return f"{workload}-{strategy}{suffix}"


def run_one(cluster, workload: str, strategy: str, steps: int, eval_every: int,
            out_dir: str, ranks: int, ranks_per_host: int, timeout: float,
            say: Callable[[str], None], placement: str = "blocked",
            env: Optional[Dict[str, str]] = None) -> Dict:
    """Run one strategy on one workload as an MPI job; return the runner's result.
    ``env``: more variables for a localhost job's ranks."""
    name = _run_name(workload, strategy, placement if cluster is not None else None)
    out = os.path.join(out_dir, f"{name}.json")
    log = os.path.join(out_dir, f"{name}.log")
    argv = [sys.executable, "-m", "hvdx.bench.runner", "--workload", workload,
            "--strategy", strategy, "--steps", str(steps), "--eval-every", str(eval_every),
            "--out", os.path.abspath(out)]
    command, extra_env = _launch_command(cluster, ranks_per_host, argv, ranks,
                                         dict(STRATEGIES[strategy].env, **(env or {})),
                                         placement)
    env = dict(os.environ, **extra_env)
    started = time.monotonic()
    contention = _Contention(cluster)
    with open(log, "w") as errors, contention:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True,
                                env=env)
        done, first = False, None
        try:
            for line in proc.stdout:
                if line.startswith('{"event": "progress"'):
                    p = json.loads(line)
                    now = time.monotonic()
                    first = first or (now, p["step"])
                    # Pace from the first report on, so start-up does not inflate it.
                    pace = (now - first[0]) / max(1, p["step"] - first[1])
                    left = f"about {pace * (p['steps'] - p['step']):.0f} s left" \
                        if p["step"] > first[1] else "estimating time left"
                    say(f"  {workload} / {strategy}: step {p['step']}/{p['steps']}, "
                        f"{WORKLOADS[workload].metric.name} {p['quality']:.3f}, {left}")
                elif line.startswith('{"event": "done"'):
                    done = True
                    break
            remaining = max(1.0, timeout - (time.monotonic() - started))
            proc.wait(timeout=min(EXIT_GRACE_S, remaining) if done else remaining)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            if not done:
                raise RuntimeError(f"{workload}/{strategy} ran past {timeout:.0f} s; see {log}")
            say(f"  {workload} / {strategy}: the job did not exit {EXIT_GRACE_S:.0f} s after "
                "writing its result; killed it")
            return _load(out, contention.log)
    if done and proc.returncode != 0 and os.path.exists(out):
        # Every rank passed the final barrier and rank 0 wrote the result: a failure now
        # is the launcher's teardown (Hydra's proxy was once seen to assert while ranks
        # left), not the measurement's. Kept, and said.
        say(f"  {workload} / {strategy}: the job exited with code {proc.returncode} after "
            f"writing its result (launcher teardown; see {log}); result kept")
        return _load(out, contention.log)
    if proc.returncode != 0 or not os.path.exists(out):
        with open(log) as f:
            tail = "".join(f.readlines()[-20:])
        raise RuntimeError(f"{workload}/{strategy} failed (exit {proc.returncode}):\n{tail}")
    return _load(out, contention.log)


def _load(path: str, contention_log) -> Dict:
    with open(path) as f:
        result = json.load(f)
    result["contention"] = contention_log
    return result


class _Contention:
    """The cluster spec's contention events, replayed for each run from its launch.

    Every strategy meets the same slowdowns at the same offsets from its start, and the
    configured rates are restored afterwards, so runs stay comparable.
    """

    def __init__(self, cluster):
        self.cluster = cluster
        self.timer = None

    @property
    def log(self) -> List:
        """``[seconds since launch, target, rate]`` per change applied so far."""
        return [] if self.timer is None else [list(change) for change in self.timer.log]

    def __enter__(self):
        if self.cluster is not None and self.cluster.spec.contention:
            self.timer = self.cluster.start_contention()
        return self

    def __exit__(self, *exc):
        if self.timer is None:
            return
        self.timer.stop()
        self.timer.join()
        for event in self.cluster.spec.contention:
            self.cluster.set_rate(event.target, self.cluster.configured_rate(event.target))


def _runs(strategies: List[str], placements: List[str], floor: bool = True) -> List[tuple]:
    """``(strategy, placement)`` in run order: Horovod under the first placement, the
    floor there too (unless ``floor`` is false), then every other strategy under each
    placement."""
    runs = [("horovod", placements[0])]
    if floor:
        runs.append((FLOOR, placements[0]))
    for placement in placements:
        runs += [(s, placement) for s in strategies if s not in ("horovod", FLOOR)]
    return runs


def check_placements(placements: List[str]) -> List[str]:
    """The ``--placement`` list, checked (each of :data:`PLACEMENTS`, no repeats)."""
    from hvdx.core.cost_model import PLACEMENTS

    if not placements:
        raise ValueError("--placement='' names no placement")
    for p in placements:
        if p not in PLACEMENTS:
            raise ValueError(f"--placement={p!r} is unknown; choose from "
                             f"{', '.join(PLACEMENTS)}")
    if len(set(placements)) != len(placements):
        raise ValueError(f"--placement={','.join(placements)!r} names a placement twice")
    return list(placements)


def _with_data(workloads: List[str], say: Callable[[str], None]) -> List[str]:
    """The workloads whose data is on this machine (:meth:`Workload.check_data`), in
    order; each missing one is said with what to install, and the rest still run."""
    ready = []
    for w in workloads:
        try:
            WORKLOADS[w].check_data()
        except (ImportError, RuntimeError) as e:  # DataMissing, CorpusMissing
            say(f"{w}: left out: {e}")
            continue
        ready.append(w)
    if not ready:
        raise RuntimeError(f"none of --workloads={','.join(workloads)} has its data on "
                           f"this machine (see above)")
    return ready


def not_applicable(workloads: Sequence[str], strategies: Sequence[str]) -> List[str]:
    """One line per (workload, strategy) pair that does not run, and why."""
    return ([f"{w}: {s} does not apply: {WORKLOADS[w].does_not_apply[s]}"
             for w in workloads for s in strategies if s in WORKLOADS[w].does_not_apply] +
            [f"{w}: {s} is not run: its settings there are {first}'s ({settings}); see "
             f"{first}'s row"
             for (w, s), (first, settings) in same_settings(workloads, strategies).items()])


def same_settings(workloads: Sequence[str], strategies: Sequence[str]
                  ) -> Dict[Tuple[str, str], Tuple[str, object]]:
    """``(workload, strategy) -> (the earlier strategy, the settings both run)`` for each
    strategy whose settings on the workload
    (:attr:`~hvdx.bench.strategies.Strategy.settings_on`) equal an earlier one's in
    ``strategies``: both presets under an adaptive optimizer, for example. The run would
    repeat the earlier one, so it is measured once."""
    same: Dict[Tuple[str, str], Tuple[str, object]] = {}
    for w in workloads:
        seen: List[Tuple[str, object]] = []
        for s in strategies:
            row = STRATEGIES.get(s)
            if row is None or row.settings_on is None or s in WORKLOADS[w].does_not_apply:
                continue
            settings = row.settings_on(WORKLOADS[w])
            first = next((name for name, other in seen if other == settings), None)
            if first is None:
                seen.append((s, settings))
            else:
                same[w, s] = (first, settings)
    return same


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
    run its local step (:func:`_local_step`), and, with ``full``, its local step again
    right after that run and, before and after each run, the collectives it is priced by
    that drift with the machine (:func:`_retiming`); write and return the summaries.

    Without ``full`` the run is the quick one ``bash scripts/main`` starts with: the
    calibration is minutes old at every run, so nothing is timed again, and one local
    run per strategy prices it (:data:`LOCAL_STEPS` explains what a second one adds)."""
    check_workloads(workloads)
    for item in strategies:
        if item not in STRATEGIES:
            raise ValueError(f"strategy={item!r} is unknown; choose from {sorted(STRATEGIES)}")
    workloads = _with_data(workloads, say)
    placements = check_placements(placements or ["blocked"])
    os.makedirs(out_dir, exist_ok=True)
    cluster, network = _start_cluster(spec, say)
    cluster_used = cluster is not None
    if not cluster_used and len(placements) > 1:
        say(f"localhost: one host, so placements {', '.join(placements[1:])} are the same "
            "run; running one")
        placements = placements[:1]
    runs = _runs(strategies, placements, floor)
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
                        [_run_estimate_s(spec if cluster_used else None, w, s,
                                         steps or WORKLOADS[w].steps(full), ranks, priced,
                                         full)
                         for w in workloads for s, _ in runs if (w, s) not in skipped])
        if priced:
            left.start()
            calibration = _calibrate(cluster, ranks_per_host, out_dir, timeout, say,
                                     [_model_bytes(w) for w in workloads])
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
                    local_steps[w, s] = _local_step(w, s, out_dir, ranks, timeout, say,
                                                    spec, ranks_per_host, local_count)
                # The collectives the plan prices the run by, timed again around it.
                retime = _retiming(w, s, calibration) if priced and full else None
                again = [retime(cluster, ranks_per_host, out_dir, timeout, say)] \
                    if retime else []
                result = run_one(cluster, w, s, steps or WORKLOADS[w].steps(full),
                                 eval_every, out_dir, ranks, ranks_per_host, timeout, say,
                                 placement=placement)
                if retime:
                    again.append(retime(cluster, ranks_per_host, out_dir, timeout, say))
                    timed = _mean_times([a for a in again if a is not None])
                    if timed:
                        result[retime.field] = timed
                if local_steps.get((w, s)) is not None and (w, s) not in bracketed:
                    # And, in a full run, just after it, once per strategy (see
                    # LOCAL_STEPS).
                    after = _local_step(w, s, out_dir, ranks, timeout, say, spec,
                                        ranks_per_host, local_count) if full else None
                    bracketed[w, s] = [local_steps[w, s]] + ([] if after is None
                                                             else [after])
                if (w, s) in bracketed:
                    _add_local_runs(result, bracketed[w, s])
                raw.append(result)
                rows.append(summarize(result, WORKLOADS[w].target, network,
                                      WORKLOADS[w].metric))
                left.finish()
        say(f"done in {format_duration(left.elapsed_s())}")
    finally:
        if cluster is not None:
            cluster.close()
    _add_speedups(rows)
    _add_floor(rows)
    _add_predictions(rows, raw, spec if cluster_used else None, calibration)
    _write(rows, raw, out_dir)
    return rows


def _mean_times(timings: List[Dict[str, List[list]]]) -> Dict[str, List[list]]:
    """``{group: [[bytes, seconds]]}`` with each group's and size's mean over
    ``timings``, for the groups and sizes all of them timed."""
    out: Dict[str, List[list]] = {}
    for group in set.intersection(*(set(t) for t in timings)) if timings else ():
        tables = [dict(map(tuple, t[group])) for t in timings]
        sizes = sorted(set.intersection(*(set(t) for t in tables)))
        if sizes:
            out[group] = [[b, sum(t[b] for t in tables) / len(tables)] for b in sizes]
    return out


def _add_local_runs(result: Dict, runs: List[LocalRun]) -> None:
    """Record a run's local runs in its result, and their means: the step and the wait
    the plan prices it from (:func:`_add_predictions`); a wait only if every run had one."""
    result["local_steps_s"] = [r.step_s for r in runs]
    result["local_step_s"] = sum(result["local_steps_s"]) / len(runs)
    waits = [r.wait_s for r in runs if r.wait_s is not None]
    if len(waits) == len(runs) and runs[0].cores:
        result["local_waits_s"] = waits
        result["local_wait_s"] = sum(waits) / len(waits)
        result["local_cores"] = runs[0].cores


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


#: A priori seconds of the calibration job (about three minutes on 2 cores for 2x2
#: hosts), of launching one MPI job of the bench (importing torch and Horovod on every
#: rank), and of one training step on every rank of one host, for the first estimate of
#: the time left (:class:`hvdx.bench.progress.TimeLeft` corrects them as stages finish).
CALIBRATION_ESTIMATE_S = 180.0
LAUNCH_ESTIMATE_S = 12.0
LOCAL_STEP_ESTIMATE_S = 0.1


def _run_estimate_s(spec, workload: str, strategy: str, steps: int, ranks: int,
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


def _local_step(workload: str, strategy: str, out_dir: str, ranks: int, timeout: float,
                say, spec=None, ranks_per_host: int = 1,
                steps: int = LOCAL_STEPS) -> Optional[LocalRun]:
    """The strategy's mean step after :data:`WARMUP_STEPS` with every rank on this host,
    talking through shared memory, ``steps`` steps (:data:`LOCAL_STEPS` in a full run,
    as many as the cluster run in a quick one), and its ranks' waits
    (:func:`local_wait`): the step the calibrated plan adds the cluster's wire to
    (:func:`_add_predictions`). A run that fails is said and gives ``None`` (the plan
    then takes the floor's step).

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
        result = run_one(None, workload, strategy, steps, steps, local_dir,
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


def _calibrate(cluster, ranks_per_host: int, out_dir: str, timeout: float, say,
               model_bytes: Sequence[int] = ()):
    """The calibration job on the cluster, blocked placement (what the planner needs:
    :mod:`hvdx.mpi.calibrate`), Horovod's averages timed at the workloads'
    ``model_bytes`` too (between two timed sizes their time is far from linear: on all
    ranks of the 2x2 cluster 38 ms at 1 KiB, 196 at 1 MiB, 77 at 150 KB), then again on
    this host (:func:`_local_set_averages`); ``None``, said, if it fails: the plan
    column then comes from the configured rates."""
    path = os.path.abspath(os.path.join(out_dir, "calibration.json"))
    say("calibrating the cost model: timing exchange rounds on each link class")
    sizes = [option for nbytes in sorted(set(model_bytes))
             for option in ("--set-average-bytes", str(nbytes))]
    calibration = _calibration_job(cluster, ranks_per_host, path, sizes, timeout, say)
    if calibration is None:
        say("  the plan column comes from the configured rates")
        return None
    if calibration.set_allreduce_times:
        calibration = _local_set_averages(cluster, ranks_per_host, path, timeout, say) \
            or calibration
    return calibration


def _local_set_averages(cluster, ranks_per_host: int, path: str, timeout: float, say):
    """The calibration at ``path`` with Horovod's averages timed again with every rank
    on this host, standing in for ``cluster`` (its racks as labels, blocked placement as
    the calibration's), written back to ``path``: the part of each average that a local
    step holds already (:class:`~hvdx.core.calibration.Calibration` step 8); ``None``,
    said, if the job fails (the plan then adds the averages whole)."""
    spec = cluster.spec
    per_rack = spec.hosts_per_rack * ranks_per_host
    ranks = spec.racks * per_rack
    local = os.path.join(os.path.dirname(path), "calibration_local.json")
    say("  timing Horovod's averages again with every rank on this host")
    calibration = _calibration_job(
        None, ranks_per_host, local,
        ["--local-set-averages-of", path, "--racks",
         ",".join(str(r // per_rack) for r in range(ranks))],
        min(timeout, 300.0), say, ranks=ranks)
    if calibration is None or not calibration.local_set_allreduce_times:
        return None
    calibration.save(path)
    return calibration


def _params(workload: str) -> int:
    """How many parameters the workload's model has."""
    return sum(p.numel() for p in WORKLOADS[workload].make_model().parameters())


def _model_bytes(workload: str) -> int:
    """Bytes of the workload's parameters, as DS-Sync averages them (float32)."""
    return 4 * _params(workload)


def _retiming(workload: str, strategy: str, calibration):
    """What the plan prices ``strategy``'s run by that drifts with the machine, as a
    job to run before and after it (``(cluster, ranks_per_host, out_dir, timeout, say)
    -> times or None``, its ``field`` the run result's key for their mean), or ``None``.

    On shared cores, the same collective's time moves by a third or more within
    minutes (Horovod's average on the rack sets: 61 and 189 ms; sharded TopK's step:
    154 and 213 ms in two calibrations of one cluster), so a calibration made before
    the first workload prices a run a quarter of an hour later from another machine.
    DS-Sync's averages through Horovod are timed again at the model's size
    (:func:`_set_averages_again`); sharded TopK's step at the strategy's own uplink size
    and downlink multiple (:func:`_sharded_topk_again`)."""
    from hvdx.core.cost_model import topk_pair_bytes

    strategy = STRATEGIES[strategy]
    if calibration is None:
        return None
    if strategy.cost_model == "dssync" and calibration.set_allreduce_times:
        nbytes = _model_bytes(workload)

        def job(*args):
            return _set_averages_again(*args, nbytes)
        job.field = "set_allreduce_times"
        return job
    options = strategy.cost_options
    if strategy.cost_model == "topk" and options.get("mode") == "sharded" and \
            calibration.sharded_topk_times:
        up, down = topk_pair_bytes(_params(workload), options["ratio"],
                                   options.get("downlink_ratio"))

        def job(*args):
            return _sharded_topk_again(*args, up, down / up)
        job.field = "sharded_topk_times"
        return job
    return None


def _set_averages_again(cluster, ranks_per_host: int, out_dir: str, timeout: float,
                        say, model_bytes: int = 0) -> Optional[Dict[str, List[list]]]:
    """Horovod's averages on process sets timed again (:mod:`hvdx.mpi.calibrate` step
    9), as ``{group: [[bytes, seconds]]}``, at ``model_bytes`` too where given;
    ``None``, said, if the job fails. Their time drifts with the machine (61 and 189
    ms for the same average within minutes), so the bench times them around DS-Sync's
    cluster run, and at the model's own size rather than interpolated between two
    timed sizes (which carries both sizes' noise to it)."""
    return _timed_again(cluster, ranks_per_host, out_dir, timeout, say,
                        "set_averages.json", "set_allreduce_times", ["--set-averages-of"] +
                        (["--set-average-bytes", str(model_bytes)] if model_bytes else []))


def _sharded_topk_again(cluster, ranks_per_host: int, out_dir: str, timeout: float,
                        say, up_bytes: int, multiple: float
                        ) -> Optional[Dict[str, List[list]]]:
    """Sharded TopK's step timed again (:mod:`hvdx.mpi.calibrate` step 7, its end) at
    ``up_bytes`` per rank with a downlink ``multiple`` times as dense, as ``{str(multiple):
    [[bytes, seconds]]}``; ``None``, said, if the job fails."""
    return _timed_again(cluster, ranks_per_host, out_dir, timeout, say,
                        "sharded_topk.json", "sharded_topk_times",
                        ["--sharded-topk-of", "--sharded-topk-bytes", str(up_bytes),
                         "--downlink-multiple", repr(float(multiple))])


def _timed_again(cluster, ranks_per_host: int, out_dir: str, timeout: float, say,
                 file_name: str, field: str, options: List[str]
                 ) -> Optional[Dict[str, List[list]]]:
    """Runs the calibration job in one of its modes that times a part again
    (``options``: the mode's flag, then its own options; the bench's calibration is
    the base), writing ``file_name`` in ``out_dir``, and returns that part, the
    :class:`~hvdx.core.calibration.Calibration` ``field``, as JSON-ready
    ``{str(key): [[bytes, seconds]]}``; ``None``, said, if the job fails or timed
    nothing."""
    base = os.path.abspath(os.path.join(out_dir, "calibration.json"))
    again = os.path.abspath(os.path.join(out_dir, file_name))
    calibration = _calibration_job(cluster, ranks_per_host, again,
                                   options[:1] + [base] + options[1:],
                                   min(timeout, 300.0), say)
    times = getattr(calibration, field, None)
    if not times:
        return None
    return {str(key): [list(p) for p in points] for key, points in times.items()}


def _calibration_job(cluster, ranks_per_host: int, path: str, options: List[str],
                     timeout: float, say, ranks: int = 0):
    """Runs ``python -m hvdx.mpi.calibrate --out path`` with ``options`` on the
    cluster (``None``: ``ranks`` ranks on this host), its progress said; the calibration
    it wrote, or ``None``, said."""
    from hvdx.cluster import mpiexec_command
    from hvdx.core.calibration import Calibration
    from hvdx.bench import pinning

    if os.path.exists(path):
        os.remove(path)  # a file left by an earlier run must not pass for this one's
    argv = pinning.command([sys.executable, "-m", "hvdx.mpi.calibrate", "--out", path] +
                           options)
    env = {"OMP_NUM_THREADS": "1", pinning.PIN_ENV: pinning.cores_value()}
    if cluster is None:
        command, env = ["mpirun", "-n", str(ranks)] + argv, dict(os.environ, **env)
    else:
        command, env = mpiexec_command(cluster, argv, ppn=ranks_per_host, env=env), None
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    # A job that hangs is killed after ``timeout`` and counts as failed.
    deadline = threading.Timer(timeout, proc.kill)
    deadline.start()
    try:
        for line in proc.stdout:
            if line.startswith("calibrated "):
                say("  " + line.strip())
            if line.startswith("written: "):
                break
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        proc.kill()  # the file is complete (written atomically); the job did not exit
        proc.wait()
    finally:
        deadline.cancel()
    if not os.path.exists(path):
        say(f"  the calibration job failed (exit {proc.returncode}"
            f"{', killed after %.0f s' % timeout if proc.returncode == -9 else ''})")
        return None
    return Calibration.load(path)


def _start_cluster(spec, say):
    if spec is None:
        return None, "localhost (no emulated bottleneck)"
    from hvdx.cluster import ClusterUnavailable, EmulatedCluster, format_rate

    try:
        cluster = EmulatedCluster(spec).start()
    except ClusterUnavailable as e:
        # Loudly, first and in every result: ratios measured here say nothing about a
        # slow network, and a reader must not take them for the emulated cluster's.
        say(f"WARNING: no emulated cluster ({e}); FALLING BACK TO PLAIN LOCALHOST, where "
            "no link is a bottleneck: the ratios below are not the emulated cluster's")
        return None, f"LOCALHOST FALLBACK (no emulated cluster: {e})"
    if spec.racks == 1:
        # One rack: every flow stays behind the rack's switch; the NICs are the links.
        network = (f"emulated flat {spec.hosts_per_rack} hosts (1 rack), NIC "
                   f"{format_rate(cluster.configured_rate('h0'))}")
    else:
        network = (f"emulated {spec.racks}x{spec.hosts_per_rack}, NIC "
                   f"{format_rate(cluster.configured_rate('h0'))}, uplink "
                   f"{format_rate(cluster.configured_rate('uplink0'))}")
    return cluster, network


def _write(rows: List[Summary], raw: List[Dict], out_dir: str) -> None:
    table = [dict(asdict(r), bytes_agreement=r.bytes_agreement,
                  prediction_error=r.prediction_error) for r in rows]
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"summary": table, "runs": raw}, f, indent=1)
    with open(os.path.join(out_dir, "results.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    from hvdx.bench.plot import plot

    plot(raw, rows, os.path.join(out_dir, "results.png"))


def fastest_lines(rows: List[Summary]) -> List[str]:
    """Per workload and placement, the strategy that trained a batch fastest (mean step
    over its data ranks, as :attr:`Summary.prediction_error` measures) and the one the
    plan ranks first: the verdict ``hvdx plan`` would have given, checked."""
    def fastest(row: Summary, per_batch: float) -> str:
        # The table shows whole steps; a batch's time is a step shared by the ranks
        # that train on a batch (stanza's FC workers do not), so say how it was made.
        step, kind = (row.mean_step_s, "mean") if row.mean_step_s else \
            (row.median_step_s, "median")
        ranks = f"{row.data_ranks} data rank{'s' if row.data_ranks != 1 else ''}"
        return (f"fastest per batch: {row.strategy}, {per_batch * 1e3:.1f} ms per batch "
                f"(its {step * 1e3:.1f} ms {kind} step over {ranks})")

    lines = []
    for key in dict.fromkeys((r.workload, r.placement) for r in rows):
        priced = [r for r in rows if (r.workload, r.placement) == key and r.data_ranks
                  and r.predicted_step_s and (r.mean_step_s or r.median_step_s)]
        if len(priced) < 2:
            continue
        measured = {r.strategy: (r.mean_step_s or r.median_step_s) / r.data_ranks
                    for r in priced}
        planned = {r.strategy: r.predicted_step_s / r.data_ranks for r in priced}
        best, named = min(measured, key=measured.get), min(planned, key=planned.get)
        where = key[0] + (f" ({key[1]} placement)" if key[1] not in (None, "blocked") else "")
        said = fastest(next(r for r in priced if r.strategy == best), measured[best])
        close = tied(planned)
        first = next(r for r in priced if r.strategy == named)
        if len(close) > 1 and first.predicted_compute_s is not None and \
                compute_bound(first.predicted_step_s, first.predicted_compute_s):
            # What hvdx plan says on these figures: no winner (hvdx.plan's verdict).
            lines.append(f"{where}: {said}; mostly compute, the plan calls it too close "
                         f"to call between {', '.join(close)}"
                         + ("" if best in close else
                            f", and {best} was not among them"))
            continue
        verdict = "the plan names it" if named == best else (
            f"the plan names {named} ({planned[named] * 1e3:.1f} ms per batch), which took "
            f"{measured[named] / measured[best] - 1:.0%} longer"
            + (f"; the plan had {best} within its {PLAN_TOLERANCE:.0%} error of it"
               if best in tied(planned) else ""))
        lines.append(f"{where}: {said}, {planned[best] * 1e3:.1f} ms planned; {verdict}")
    return lines


def _fmt(value, spec, none="-"):
    return none if value is None else format(value, spec)


def render_table(rows: List[Summary]) -> str:
    """The comparison table, one row per workload and strategy (and placement, when a
    run placed ranks other than blocked: ``decentralized@interleaved``)."""
    header = ("workload", "strategy", "step ms", "x floor", "to target s", "final",
              "MB/rank/step", "iface rx MB", "agree", "step x", "target x", "mean ms",
              "plan ms", "plan err")
    placed = any(r.placement not in (None, "blocked") for r in rows)
    table = [header]
    for r in rows:
        name = f"{r.strategy}@{r.placement}" if placed and r.placement else r.strategy
        table.append((
            r.workload, name, _fmt(r.median_step_s * 1e3, ".1f"), _fmt(r.floor_multiple, ".2f"),
            _fmt(r.time_to_target_s, ".1f", "not reached"),
            f"{r.final_quality:.3f} {r.unit}",
            _fmt(r.hvdx_bytes_per_step / 1e6, ".3f"),
            _fmt(r.interface_rx_per_step and r.interface_rx_per_step / 1e6, ".3f"),
            _fmt(r.bytes_agreement, ".3f"), _fmt(r.step_speedup, ".2f"),
            _fmt(r.target_speedup, ".2f"),
            _fmt(r.mean_step_s and r.mean_step_s * 1e3, ".1f"),
            _fmt(r.predicted_step_s and r.predicted_step_s * 1e3, ".1f"),
            _fmt(r.prediction_error, "+.0%")))
    # Columns at least 12 wide, wider for long names (decentralized_static@interleaved).
    widths = [max(12, *(len(row[i]) for row in table)) for i in range(len(header))]
    lines = [rows[0].network if rows else ""]
    lines += ["  ".join(f"{c:>{w}}" for c, w in zip(row, widths)) for row in table]
    return "\n".join(lines)
