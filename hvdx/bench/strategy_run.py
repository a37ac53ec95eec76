"""One strategy's run on one workload as an MPI job of :mod:`hvdx.bench.runner`.

Steps:
1. start the emulated cluster, or say loudly that the run falls back to plain
   localhost (:func:`start_cluster`);
2. build the job's command: every rank pinned to a core (:mod:`hvdx.bench.pinning`),
   on the emulated hosts in the placement's order (:func:`placement_hosts`) or under
   ``mpirun`` on this host (:func:`launch_command`);
3. run it while the cluster spec's contention events replay from its launch
   (:class:`_Contention`), relaying the ranks' progress; a job that outlives its
   written result by :data:`EXIT_GRACE_S` is killed and its result kept
   (:func:`run_one`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

from hvdx.bench.strategies import STRATEGIES
from hvdx.bench.workloads import WORKLOADS

__all__ = ["EXIT_GRACE_S", "launch_command", "placement_hosts", "run_name", "run_one",
           "start_cluster"]

#: Seconds a job may take to exit after its result is written. Its ranks finalize MPI
#: through :func:`hvdx.mpi.finalize.finalize`, which removed the known cause of jobs that
#: never exited (MPICH's own MPI_Finalize deadlocking over UCX's TCP transport); should
#: one still hang, the result is complete by then, so it is killed, and said.
EXIT_GRACE_S = 30.0


def start_cluster(spec, say):
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


def launch_command(cluster, ranks_per_host: int, argv: List[str], ranks: int,
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


def run_name(workload: str, strategy: str, placement: Optional[str]) -> str:
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
    name = run_name(workload, strategy, placement if cluster is not None else None)
    out = os.path.join(out_dir, f"{name}.json")
    log = os.path.join(out_dir, f"{name}.log")
    argv = [sys.executable, "-m", "hvdx.bench.runner", "--workload", workload,
            "--strategy", strategy, "--steps", str(steps), "--eval-every", str(eval_every),
            "--out", os.path.abspath(out)]
    command, extra_env = launch_command(cluster, ranks_per_host, argv, ranks,
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

