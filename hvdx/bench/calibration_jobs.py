"""The bench's calibration jobs (``python -m hvdx.mpi.calibrate``): the calibration that
prices the ``plan`` column (:func:`calibrate`), and, in a full run, the collectives a run
is priced by that drift with the machine, timed again around it (:func:`retiming`,
their mean :func:`mean_times`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Dict, List, Optional, Sequence

from hvdx.bench.strategies import STRATEGIES
from hvdx.bench.workloads import WORKLOADS

__all__ = ["calibrate", "calibration_job", "mean_times", "model_bytes", "retiming",
           "set_averages_again", "sharded_topk_again"]


def calibrate(cluster, ranks_per_host: int, out_dir: str, timeout: float, say,
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
    calibration = calibration_job(cluster, ranks_per_host, path, sizes, timeout, say)
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
    calibration = calibration_job(
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


def model_bytes(workload: str) -> int:
    """Bytes of the workload's parameters, as DS-Sync averages them (float32)."""
    return 4 * _params(workload)


def retiming(workload: str, strategy: str, calibration):
    """What the plan prices ``strategy``'s run by that drifts with the machine, as a
    job to run before and after it (``(cluster, ranks_per_host, out_dir, timeout, say)
    -> times or None``, its ``field`` the run result's key for their mean), or ``None``.

    On shared cores, the same collective's time moves by a third or more within
    minutes (Horovod's average on the rack sets: 61 and 189 ms; sharded TopK's step:
    154 and 213 ms in two calibrations of one cluster), so a calibration made before
    the first workload prices a run a quarter of an hour later from another machine.
    DS-Sync's averages through Horovod are timed again at the model's size
    (:func:`set_averages_again`); sharded TopK's step at the strategy's own uplink size
    and downlink multiple (:func:`sharded_topk_again`)."""
    from hvdx.core.cost_model import topk_pair_bytes

    strategy = STRATEGIES[strategy]
    if calibration is None:
        return None
    if strategy.cost_model == "dssync" and calibration.set_allreduce_times:
        nbytes = model_bytes(workload)

        def job(*args):
            return set_averages_again(*args, nbytes)
        job.field = "set_allreduce_times"
        return job
    options = strategy.cost_options
    if strategy.cost_model == "topk" and options.get("mode") == "sharded" and \
            calibration.sharded_topk_times:
        up, down = topk_pair_bytes(_params(workload), options["ratio"],
                                   options.get("downlink_ratio"))

        def job(*args):
            return sharded_topk_again(*args, up, down / up)
        job.field = "sharded_topk_times"
        return job
    return None


def set_averages_again(cluster, ranks_per_host: int, out_dir: str, timeout: float,
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


def sharded_topk_again(cluster, ranks_per_host: int, out_dir: str, timeout: float,
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
    calibration = calibration_job(cluster, ranks_per_host, again,
                                   options[:1] + [base] + options[1:],
                                   min(timeout, 300.0), say)
    times = getattr(calibration, field, None)
    if not times:
        return None
    return {str(key): [list(p) for p in points] for key, points in times.items()}


def calibration_job(cluster, ranks_per_host: int, path: str, options: List[str],
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


def mean_times(timings: List[Dict[str, List[list]]]) -> Dict[str, List[list]]:
    """``{group: [[bytes, seconds]]}`` with each group's and size's mean over
    ``timings``, for the groups and sizes all of them timed."""
    out: Dict[str, List[list]] = {}
    for group in set.intersection(*(set(t) for t in timings)) if timings else ():
        tables = [dict(map(tuple, t[group])) for t in timings]
        sizes = sorted(set.intersection(*(set(t) for t in tables)))
        if sizes:
            out[group] = [[b, sum(t[b] for t in tables) / len(tables)] for b in sizes]
    return out

