"""What Horovod process sets cost DS-Sync: static against dynamic, rotation against shuffle.

Horovod (0.28) offers two ways to hold the groups DS-Sync averages in:

- *static*: every set is passed to ``hvd.init(process_sets=[...])``; nothing can be
  added later;
- *dynamic*: ``hvd.init(process_sets="dynamic")``, then ``hvd.add_process_set`` (a
  blocking negotiation of all ranks). In this mode Horovod's background loop also
  agrees on the table of sets in every cycle (Horovod issues #3557, #3632 report slowdowns).

A rotation schedule uses a small, fixed set of groups, registered once; a shuffle
schedule draws new groups every step, and hvdx registers the next 16 steps' groups
whenever a step needs one it has not registered (sets are never removed, so the table
grows up to the number of distinct groups, ``C(n, g) / ...``).

One measurement (one MPI job, launched by :func:`run` for each case):

1. ``hvd.init`` in the case's mode, timed (a static init creates its sets there);
2. a DS-Sync optimizer over ``model_floats`` parameters (one linear layer), whose
   construction registers the rotation's sets (dynamic), timed;
3. ``steps`` optimizer steps with ``lr = 0``, each timed; a shuffle step that
   registers sets is counted apart;
4. ``steps`` plain ``hvd.allreduce`` of one float on the global set: the latency a
   job pays per collective in that mode, DS-Sync or not.

Rank 0 prints one JSON line; :func:`run` collects them into one table.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, Dict, List, Optional

import numpy as np

from hvdx.bench.jobs import report, run_job

__all__ = ["CASES", "run", "render"]

#: (name, hvd.init mode, DS-Sync schedule)
CASES = (
    ("rotation, static sets", "static", "rotation"),
    ("rotation, dynamic sets", "dynamic", "rotation"),
    ("shuffle g=2, dynamic sets", "dynamic", "shuffle"),
    ("no DS-Sync, default init", "none", None),
)


def _one(mode: str, schedule: Optional[str], steps: int, model_floats: int) -> Dict:
    import torch

    import hvdx
    import hvdx.torch as hvd

    from mpi4py import MPI

    from hvdx.core.topology import Topology

    size = MPI.COMM_WORLD.Get_size()
    sync = None
    if schedule == "rotation":
        # The layout of the benchmark's cluster, given rather than detected, so that the
        # rotation has the same groups on localhost (one host) as on emulated racks.
        racks = 2 if size % 2 == 0 and size > 2 else 1
        sync = hvdx.DSSync("rotation", intra_phases=1, cross_ranks=1,
                           topology=Topology.from_counts(racks, size // racks))
    elif schedule == "shuffle":
        sync = hvdx.DSSync("shuffle", group_size=2, seed=1)
    start = time.perf_counter()
    if mode == "static":
        hvd.init(process_sets=hvd.dssync_process_sets(sync, size))
    elif mode == "dynamic":
        hvd.init(process_sets="dynamic")
    else:
        hvd.init()
    init_s = time.perf_counter() - start
    torch.set_num_threads(1)
    result = {"mode": mode, "schedule": schedule, "ranks": hvd.size(), "init_s": init_s}

    if sync is not None:
        model = torch.nn.Linear(model_floats, 1, bias=False)
        local = torch.optim.SGD(model.parameters(), lr=0.0)
        hvd.barrier()
        start = time.perf_counter()
        opt = hvd.DistributedOptimizer(local, named_parameters=model.named_parameters(),
                                       sync=sync)
        result["construct_s"] = time.perf_counter() - start
        registered = _registered(opt)
        times, registering = [], []
        for _ in range(steps):
            before = _registered(opt)
            hvd.barrier()
            start = time.perf_counter()
            opt.step()
            elapsed = time.perf_counter() - start
            (registering if _registered(opt) != before else times).append(elapsed)
        result.update(step_ms=1e3 * float(np.median(times)) if times else None,
                      registering_steps=len(registering),
                      registering_ms=1e3 * float(np.median(registering)) if registering
                      else None,
                      sets_at_start=registered, sets_at_end=_registered(opt))
    scalar = torch.zeros(1)
    hvd.barrier()
    latencies = []
    for i in range(steps):
        start = time.perf_counter()
        hvd.allreduce(scalar, name=f"latency.{i % 4}")
        latencies.append(time.perf_counter() - start)
    result["allreduce_scalar_ms"] = 1e3 * float(np.median(latencies))
    return result


def _registered(opt) -> int:
    """How many groups the optimizer holds a process set for."""
    groups = getattr(opt, "hvdx_groups", None)
    return len(groups.registered_groups) if groups is not None else 0


def run(ranks: int = 4, steps: int = 64, model_floats: int = 1 << 20,
        launcher: Optional[Callable[[List[str]], List[str]]] = None,
        say: Callable[[str], None] = print) -> List[Dict]:
    """Run every case of :data:`CASES` as its own MPI job; return rank 0's results.

    ``launcher`` turns the per-rank command into the MPI command (default:
    ``mpirun -n ranks``).
    """
    rows = []
    for label, mode, schedule in CASES:
        argv = [sys.executable, "-m", "hvdx.bench.process_sets", "--mode", mode,
                "--steps", str(steps), "--model-floats", str(model_floats)]
        if schedule:
            argv += ["--schedule", schedule]
        command = launcher(argv) if launcher else ["mpirun", "-n", str(ranks)] + argv
        say(f"process sets: {label} ({ranks} ranks, {steps} steps)")
        row = run_job(command, f"process-set case {label!r}", timeout=600)
        row["case"] = label
        rows.append(row)
    return rows


def render(rows: List[Dict]) -> str:
    """One line per case, times in ms; ratios against the static rotation."""
    def ms(value):
        return "-" if value is None else f"{value:.2f}"

    base = next((r for r in rows if r["mode"] == "static"), None)
    lines = ["| case | init ms | construct ms | step ms | x static | registering steps "
             "(ms each) | sets start/end | scalar allreduce ms |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "-"
        if base and base.get("step_ms") and r.get("step_ms"):
            ratio = f"{r['step_ms'] / base['step_ms']:.2f}"
        construct = r.get("construct_s")
        lines.append(
            f"| {r['case']} | {ms(1e3 * r['init_s'])} | "
            f"{ms(None if construct is None else 1e3 * construct)} | {ms(r.get('step_ms'))} | "
            f"{ratio} | {r.get('registering_steps', '-')} ({ms(r.get('registering_ms'))}) | "
            f"{r.get('sets_at_start', '-')}/{r.get('sets_at_end', '-')} | "
            f"{ms(r['allreduce_scalar_ms'])} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description="one rank of the process-set measurement")
    parser.add_argument("--mode", choices=("static", "dynamic", "none"), required=True)
    parser.add_argument("--schedule", choices=("rotation", "shuffle"))
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--model-floats", type=int, default=1 << 20)
    args = parser.parse_args(argv)
    result = _one(args.mode, args.schedule, args.steps, args.model_floats)
    report(result)


if __name__ == "__main__":
    main()
