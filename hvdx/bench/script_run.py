"""``hvdx bench --script train.py``: the user's own Horovod script, under Horovod and
each strategy, on the emulated cluster; the script is not changed on disk.

Steps:
1. read the script and switch its Horovod import lines to hvdx
   (:func:`hvdx.bench.script.switch_imports`); refuse it before anything starts if
   there is nothing to switch;
2. build the emulated cluster (or fall back to localhost, loudly, as the harness does);
3. for each strategy, Horovod first: write the switched copy to the output directory
   and launch it as an MPI job with the strategy's variables
   (:func:`hvdx.bench.script.strategy_environment`), ``HVDX_BENCH_STEP_LOG`` (each
   rank's optimizer step times, :mod:`hvdx.step_log`) and the script's own directory on
   ``PYTHONPATH``; read every host's data interface counters from outside before and
   after the job; keep the job's output (rank 0's ``Iter #N: X img/sec`` lines are
   relayed as progress);
4. summarise each run (:class:`ScriptSummary`): wall time of the job, median step from
   the step log, img/sec where the script prints it, bytes per rank per step by hvdx's
   count and by the interfaces, speedups over Horovod (step, img/sec, wall); write
   ``results.json``, ``results.csv`` and ``results.png`` and print the table.

What it cannot see: the interfaces count the whole job (start-up, the initial
broadcast, anything the script sends besides its steps), divided by the steps in the
step log; a script that never steps through hvdx (torch's ``DistributedOptimizer``,
TensorFlow's ``DistributedGradientTape``, Keras' ``DistributedOptimizer``) gets its wall
time and printed img/sec only.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional

import numpy as np

from hvdx import step_log
from hvdx.bench.script import parse_throughput, strategy_environment, switch_imports
from hvdx.bench.strategies import STRATEGIES
from hvdx.bench.strategy_row import allreduce_bytes_per_rank

__all__ = ["ScriptSummary", "prepare", "render_table", "run_script_bench", "summarize"]

#: Seconds a job may take to exit after every rank wrote its step log.
EXIT_GRACE_S = 30.0


@dataclass
class ScriptSummary:
    """One row of ``hvdx bench --script``'s table."""

    script: str
    strategy: str
    network: str
    ranks: int
    steps: Optional[int]
    wall_s: float
    median_step_s: Optional[float]
    img_per_s: Optional[float]
    hvdx_bytes_per_step: Optional[float]
    hvdx_received_per_step: Optional[float]
    interface_tx_per_step: Optional[float]
    interface_rx_per_step: Optional[float]
    step_speedup: Optional[float] = None
    wall_speedup: Optional[float] = None
    #: The script's img/sec over Horovod's, where both printed it.
    img_speedup: Optional[float] = None
    placement: Optional[str] = None
    #: No accuracy for a script (the table's accuracy columns read "-").
    final_accuracy: Optional[float] = None
    time_to_target_s: Optional[float] = None

    @property
    def bytes_agreement(self) -> Optional[float]:
        """Bytes the interfaces received over hvdx's count (see the harness's)."""
        if not self.interface_rx_per_step or not self.hvdx_received_per_step:
            return None
        return self.interface_rx_per_step / self.hvdx_received_per_step


def prepare(path: str) -> tuple:
    """``(switched source, changes)`` of the script at ``path``; ValueError if there is
    no such file or nothing to switch (:func:`switch_imports`)."""
    if not os.path.isfile(path):
        raise ValueError(f"--script {path}: no such file")
    with open(path, encoding="utf-8") as f:
        return switch_imports(f.read(), path)


def hvdx_bytes(strategy: str, optimizer: Optional[Dict], ranks: int, steps: int):
    """``(sent, received)`` per rank per step by hvdx's count: for Horovod, the
    allreduce's standard cost of the optimizer's parameters (as the harness); for an
    hvdx strategy, its own counters (``hvdx_stats``)."""
    if optimizer is None or not steps:
        return None, None
    if strategy == "horovod":
        each_way = allreduce_bytes_per_rank(optimizer["parameter_bytes"], ranks)
        return each_way, each_way
    stats = optimizer.get("hvdx_stats") or {}
    if "total_sent" in stats:  # TopK: each way counted
        return stats["total_sent"] / steps, stats["total_received"] / steps
    if "total_bytes" in stats:  # DS-Sync, decentralized SGD: regular, alike both ways
        return stats["total_bytes"] / steps, stats["total_bytes"] / steps
    return None, None


def summarize(result: Dict, network: str) -> ScriptSummary:
    """One run's row (``result`` as :func:`run_one` returns it)."""
    logs = {int(k): v for k, v in result["step_logs"].items()}
    first = step_log.main_optimizer(logs[min(logs)]) if logs else None
    steps = len(first["times"]) if first else None
    median = step_log.median_step(first["times"]) if first else None
    sent, received = hvdx_bytes(result["strategy"], first, result["ranks"], steps or 0)
    if logs and len(logs) > 1 and result["strategy"] != "horovod":
        # Ranks need not send alike (DS-Sync): the mean over ranks, as the harness.
        per_rank = [hvdx_bytes(result["strategy"], step_log.main_optimizer(log),
                               result["ranks"], steps or 0) for log in logs.values()]
        if all(s is not None for s, _ in per_rank):
            sent = float(np.mean([s for s, _ in per_rank]))
            received = float(np.mean([r for _, r in per_rank]))
    tx = rx = None
    counters = result.get("interface_tx_rx")
    if counters and steps:
        tx = float(np.mean([c[0] for c in counters])) / steps
        rx = float(np.mean([c[1] for c in counters])) / steps
    rates = result.get("img_per_s") or []
    return ScriptSummary(
        script=result["script"], strategy=result["strategy"], network=network,
        ranks=result["ranks"], steps=steps, wall_s=result["wall_s"],
        median_step_s=median,
        # Horovod's synthetic benchmark: the first iterations are warm-up.
        img_per_s=float(np.median(rates)) if rates else None,
        hvdx_bytes_per_step=sent, hvdx_received_per_step=received,
        interface_tx_per_step=tx, interface_rx_per_step=rx,
        placement=result.get("placement"))


def _add_speedups(rows: List[ScriptSummary]) -> None:
    base = next((r for r in rows if r.strategy == "horovod"), None)
    if base is None:
        return
    for row in rows:
        if base.median_step_s and row.median_step_s:
            row.step_speedup = base.median_step_s / row.median_step_s
        row.wall_speedup = base.wall_s / row.wall_s
        if base.img_per_s and row.img_per_s:
            row.img_speedup = row.img_per_s / base.img_per_s


class _Watchdog(threading.Thread):
    """Kills a job that runs past ``timeout``, or that lingers :data:`EXIT_GRACE_S`
    after every rank wrote its step log (the user's script leaves through MPICH's own
    ``MPI_Finalize``, which can deadlock over UCX's TCP transport:
    :mod:`hvdx.mpi.finalize`); ``why`` says which, ``None`` if neither."""

    def __init__(self, proc, timeout: float, prefix: str, ranks: int):
        super().__init__(daemon=True)
        self.proc, self.timeout, self.prefix, self.ranks = proc, timeout, prefix, ranks
        self.why: Optional[str] = None
        #: ``time.monotonic()`` when every rank's step log was there (None: not seen).
        self.written: Optional[float] = None
        self._done = threading.Event()
        self.start()

    def run(self) -> None:
        started = time.monotonic()
        while not self._done.wait(1.0):
            now = time.monotonic()
            if self.written is None and len(step_log.read(self.prefix)) >= self.ranks:
                self.written = now
            if now - started > self.timeout:
                self.why = "timeout"
            elif self.written is not None and now - self.written > EXIT_GRACE_S:
                self.why = "lingered"
            else:
                continue
            self.proc.kill()
            return

    def stop(self) -> None:
        self._done.set()
        self.join()


def run_one(cluster, script: str, source: str, script_args: List[str], strategy: str,
            out_dir: str, ranks: int, ranks_per_host: int, timeout: float,
            say: Callable[[str], None], placement: str = "blocked") -> Dict:
    """Run the switched script once under ``strategy`` as an MPI job."""
    from hvdx.bench.strategy_run import launch_command, placement_hosts, run_name

    stem = os.path.splitext(os.path.basename(script))[0]
    # A variable's value (HVDX_COMPRESSION=sign(0.5)) is no file name as it is.
    name = run_name(stem, re.sub(r"[^A-Za-z0-9_.-]+", "_", strategy).strip("_"),
                    placement if cluster is not None else None)
    copy = os.path.join(out_dir, f"{name}.py")  # the script, its imports switched
    with open(copy, "w", encoding="utf-8") as f:
        f.write(source)
    prefix = os.path.abspath(os.path.join(out_dir, f"{name}.steps"))
    for old in step_log.read(prefix):
        os.remove(step_log.path_of(prefix, old))
    env = dict(strategy_environment(strategy))
    env[step_log.VARIABLE] = prefix
    # The copy lives in the output directory: the script's own modules stay importable.
    here = os.path.dirname(os.path.abspath(script))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH"))
                                        if p)
    command, extra_env = launch_command(cluster, ranks_per_host,
                                        [sys.executable, os.path.abspath(copy)] +
                                        script_args, ranks, env, placement)
    hosts = [] if cluster is None else \
        [cluster.host(i) for i in placement_hosts(cluster.spec, placement)]
    out_log, err_log = (os.path.join(out_dir, f"{name}.{ext}") for ext in ("out", "log"))
    before = [cluster.interface_counters(h) for h in hosts]
    started = time.monotonic()
    with open(out_log, "w") as output, open(err_log, "w") as errors:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True,
                                env=dict(os.environ, **extra_env))
        watch = _Watchdog(proc, timeout, prefix, ranks)
        lines = []
        try:
            for line in proc.stdout:
                output.write(line)
                lines.append(line)
                if parse_throughput(line):
                    say(f"  {stem} / {strategy}: {line.strip()}")
            proc.wait()
        finally:
            watch.stop()
    if watch.why == "timeout":
        raise RuntimeError(f"{script} under {strategy} ran past {timeout:.0f} s; "
                           f"see {err_log}")
    lingered = watch.why == "lingered"
    if lingered:
        say(f"  {stem} / {strategy}: every rank wrote its step log but the job did not "
            f"exit within {EXIT_GRACE_S:.0f} s (MPI_Finalize); killed it, result kept")
    # A job killed while lingering ends, for its wall time, when its last rank wrote
    # its step log (to the poll's second), not when the grace ran out.
    wall = (watch.written if lingered else time.monotonic()) - started
    after = [cluster.interface_counters(h) for h in hosts]
    if proc.returncode != 0 and not lingered:
        with open(err_log) as f:
            tail = "".join(f.readlines()[-20:])
        raise RuntimeError(f"{script} under {strategy} failed (exit {proc.returncode}; "
                           f"{err_log}):\n{tail}")
    logs = step_log.read(prefix)
    return {"script": os.path.basename(script), "strategy": strategy, "ranks": ranks,
            "script_args": script_args, "copy": copy, "environment": env,
            "wall_s": wall, "killed_after_exit_grace": lingered, "img_per_s": parse_throughput("".join(lines)),
            "step_logs": {str(k): v for k, v in logs.items()},
            # Per host, the whole job (start-up and the initial broadcast included).
            "interface_tx_rx": [[a[0] - b[0], a[1] - b[1]] for b, a in zip(before, after)]
            or None,
            "placement": placement if cluster is not None else None}


def run_script_bench(spec, script: str, script_args: List[str], strategies: List[str],
                     out_dir: str, ranks_per_host: int = 1, localhost_ranks: int = 4,
                     timeout: float = 900.0, say: Callable[[str], None] = print,
                     placements: Optional[List[str]] = None,
                     notes: Optional[List[str]] = None) -> List[ScriptSummary]:
    """Run ``script`` under each strategy (Horovod first); write and return the rows."""
    from hvdx.bench.run_list import check_placements, ordered_runs
    from hvdx.bench.strategy_run import start_cluster

    source, changes = prepare(script)
    for name in strategies:
        strategy_environment(name)  # refuses a strategy that needs code, before starting
    placements = check_placements(placements or ["blocked"])
    notes = list(notes or [])
    say(f"{script}: " + ("; ".join(changes) if changes else "already imports hvdx"))
    for note in notes:
        say(f"note: {note}")
    os.makedirs(out_dir, exist_ok=True)
    cluster, network = start_cluster(spec, say)
    if cluster is None and len(placements) > 1:
        say(f"localhost: one host, so placements {', '.join(placements[1:])} are the same "
            "run; running one")
        placements = placements[:1]
    runs = ordered_runs(strategies, placements, floor=False)
    ranks = localhost_ranks if cluster is None else len(cluster.hosts) * ranks_per_host
    rows, raw = [], []
    try:
        for s, placement in runs:
            where = f"{network}, {placement} placement" if cluster is not None else network
            say(f"[{len(raw) + 1}/{len(runs)}] {shlex.join([script] + script_args)} with "
                f"{STRATEGIES[s].label if s in STRATEGIES else s} on {where}")
            result = run_one(cluster, script, source, script_args, s, out_dir, ranks,
                             ranks_per_host, timeout, say, placement)
            raw.append(result)
            rows.append(summarize(result, network))
    finally:
        if cluster is not None:
            cluster.close()
    _add_speedups(rows)
    _write(rows, raw, out_dir, changes, notes)
    return rows


def _write(rows: List[ScriptSummary], raw: List[Dict], out_dir: str, changes: List[str],
           notes: List[str]) -> None:
    table = [dict(asdict(r), bytes_agreement=r.bytes_agreement) for r in rows]
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"summary": table, "runs": raw, "switched": changes, "notes": notes},
                  f, indent=1)
    with open(os.path.join(out_dir, "results.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    from hvdx.bench.plot import plot_script

    plot_script(rows, os.path.join(out_dir, "results.png"))


def _fmt(value, spec, none="-"):
    return none if value is None else format(value, spec)


def render_table(rows: List[ScriptSummary]) -> str:
    """The comparison table, one row per strategy (and placement other than blocked)."""
    header = ("script", "strategy", "steps", "step ms", "img/sec", "wall s", "final acc",
              "MB/rank/step", "iface rx MB", "agree", "step x", "img x", "wall x")
    placed = any(r.placement not in (None, "blocked") for r in rows)
    table = [header]
    for r in rows:
        name = f"{r.strategy}@{r.placement}" if placed and r.placement else r.strategy
        table.append((
            r.script, name, _fmt(r.steps, "d"),
            _fmt(r.median_step_s and r.median_step_s * 1e3, ".1f"),
            # Three decimals under 10: ResNet-50 on CPU cores runs below 1 img/sec.
            _fmt(r.img_per_s, ".1f" if (r.img_per_s or 0) >= 10 else ".3f"),
            _fmt(r.wall_s, ".1f"), "-",
            _fmt(r.hvdx_bytes_per_step and r.hvdx_bytes_per_step / 1e6, ".3f"),
            _fmt(r.interface_rx_per_step and r.interface_rx_per_step / 1e6, ".3f"),
            _fmt(r.bytes_agreement, ".3f"), _fmt(r.step_speedup, ".2f"),
            _fmt(r.img_speedup, ".2f"), _fmt(r.wall_speedup, ".2f")))
    widths = [max(8, *(len(row[i]) for row in table)) for i in range(len(header))]
    lines = [rows[0].network if rows else ""]
    lines += ["  ".join(f"{c:>{w}}" for c, w in zip(row, widths)) for row in table]
    return "\n".join(lines)
