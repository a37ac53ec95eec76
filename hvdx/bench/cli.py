"""``hvdx bench``'s arguments and dispatch, in one place.

:func:`add_arguments` adds every ``hvdx bench`` flag to a parser; :func:`run` runs what
they ask for: the comparison against Horovod (:mod:`hvdx.bench.harness`), or one of the
focused measurements (``--selection``, ``--topk-bytes``, ``--process-sets``,
``--overlap``, ``--soak``), or the user's own script (``--script``,
:mod:`hvdx.bench.script_run`). ``hvdx bench`` (:mod:`hvdx.cli`) hands its subparser to these two;
``python -m hvdx.bench.cli`` is the same command as a program of its own.

``--full`` ends with Horovod's own PyTorch synthetic benchmark on ResNet-50
(:func:`resnet50_plan`), run through ``--script`` after the workloads.

Examples::

    hvdx bench --racks 1 --hosts-per-rack 8 --nic 100mbit \\
        --strategies horovod,decentralized,decentralized_cta
    hvdx bench --racks 2 --hosts-per-rack 4 --nic 1gbit --uplink 100mbit \\
        --strategies horovod,decentralized,decentralized_static \\
        --placement blocked,interleaved
    hvdx bench --overlap --workloads digits_vgg
    hvdx bench --soak --ranks 4 --steps 2000
    hvdx bench --script train.py --script-args "--epochs 1" --strategies horovod,fast
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import dataclass, field
from typing import List, Optional

__all__ = ["FULL_WORKLOADS", "QUICK_WORKLOADS", "RESNET50_ARGS", "ScriptPlan",
           "add_arguments", "main", "resnet50_plan", "run"]

#: A plain ``hvdx bench`` compares every strategy on the transformer, the workload users
#: recognise and a communication-bound one (13.5 minutes on a 2-core machine with the
#: calibration, against the ten it aims at: docs/benchmarks.md); ``--full`` runs all
#: four workloads, the compute-bound one included.
QUICK_WORKLOADS = "lm"
FULL_WORKLOADS = "lm,resnet,digits_vgg,digits_cnn"

#: ``--full``'s last part: Horovod's PyTorch synthetic benchmark, beside hvdx in a
#: checkout (``examples/`` is not in the wheel).
SYNTHETIC_BENCHMARK = os.path.join("examples", "pytorch_synthetic_benchmark.py")
#: Its flags there, for CPUs. One ResNet-50 step of 4 images took 3.6 s of CPU time on
#: one core (batch 2: 1.9 s), so about 7 s of wall time with 4 ranks on 2 cores; a
#: step of the fast TopK preset adds 3-4 s of CPU time in its ``step()`` (25.6 M
#: gradients), and every job broadcasts the 102 MB of parameters and as much of momentum
#: over the 100 Mbit uplink, about 13 s each, before its first step. Warm-up 1 and two
#: timed iterations of 1 batch: Horovod and the four default strategies took 9 minutes
#: on the default cluster (docs/benchmarks.md), so the six jobs of ``--full`` about 11;
#: Horovod's 224 x 224 images are kept.
RESNET50_ARGS = ("--model resnet50 --batch-size 4 --num-warmup-batches 1 "
                 "--num-batches-per-iter 1 --num-iters 2")


def add_arguments(bench: argparse.ArgumentParser) -> None:
    """Adds the ``hvdx bench`` flags (the emulated cluster's among them) to ``bench``."""
    from hvdx.bench.strategies import ALIASES, DEFAULT_STRATEGIES, FULL_STRATEGIES, STRATEGIES
    from hvdx.cluster import add_cluster_arguments

    add_cluster_arguments(bench)
    bench.add_argument("--localhost", action="store_true",
                       help="no emulated cluster: ranks on this host, shared memory")
    bench.add_argument("--ranks", type=int, default=4,
                       help="ranks with --localhost, --overlap and --soak")
    bench.add_argument("--ranks-per-host", type=int, default=1,
                       help="ranks per emulated host")
    bench.add_argument("--workloads",
                       help="comma-separated workloads (hvdx.bench.workloads) (default: "
                            f"{QUICK_WORKLOADS}, the transformer, communication-bound; with --full "
                            f"{FULL_WORKLOADS})")
    bench.add_argument("--full", action="store_true",
                       help=f"the whole comparison, about three times as long as the "
                            f"default run: all four built-in workloads ({FULL_WORKLOADS}, the "
                            "last compute-bound; --workloads still chooses), TopK "
                            "without the presets' tuning too, "
                            "and a plan priced more closely (each strategy's local run "
                            "before and after its cluster run, DS-Sync's and TopK's "
                            "collectives timed again around theirs); then Horovod's "
                            "PyTorch synthetic benchmark on ResNet-50 through --script "
                            f"({SYNTHETIC_BENCHMARK} {RESNET50_ARGS}) under Horovod and "
                            "every strategy the environment can switch a script to, "
                            "written under --out/resnet50")
    bench.add_argument("--strategies",
                       help=f"comma-separated, from {','.join(STRATEGIES)} (default: "
                            f"{','.join(DEFAULT_STRATEGIES)}; with --full "
                            f"{','.join(FULL_STRATEGIES)}); "
                            + ", ".join(f"{alias} is {name}" for alias, name in
                                        ALIASES.items())
                            + " (the presets of HVDX_COMPRESSION); with --script also "
                            "HVDX_COMPRESSION=<value> or HVDX_SYNC=<value>, e.g. a "
                            "compressor the script registers: "
                            "\"horovod,HVDX_COMPRESSION=sign(scale=True)\"")
    bench.add_argument("--placement", default="blocked", metavar="blocked[,interleaved]",
                       help="how ranks fill the emulated hosts: blocked (rack by rack) or "
                            "interleaved (rank r in rack r mod racks: the exponential "
                            "graphs' long hops stay inside racks); a list runs every "
                            "strategy but Horovod under each (Horovod under the first)")
    bench.add_argument("--steps", type=int,
                       help="training steps (default: per workload; --topk-bytes 5, "
                            "--overlap 60, --process-sets 64, --soak 2000)")
    bench.add_argument("--no-floor", action="store_true",
                       help="skip the floor run (every rank training alone, no "
                            "communication: the limit of any strategy), and with it the "
                            "table's 'x floor' column")
    bench.add_argument("--no-calibrate", action="store_true",
                       help="skip the calibration (exchange rounds timed on each link "
                            "class, and each strategy's step with every rank on this "
                            "host, before the runs); the table's plan column then comes "
                            "from the configured link rates")
    bench.add_argument("--eval-every", type=int, default=5,
                       help="steps between two accuracy evaluations")
    bench.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    bench.add_argument("--out", default="results/bench", help="output directory")
    bench.add_argument("--script", metavar="PATH",
                       help="instead of the workloads, run this Horovod script (import "
                            "horovod.torch as hvd) under Horovod and each --strategies "
                            "strategy that the environment can switch it to "
                            "(HVDX_COMPRESSION, HVDX_SYNC); a copy with its import line "
                            "switched to hvdx runs, the file is not changed; reports wall "
                            "time, median optimizer step, img/sec where printed and bytes "
                            "per rank per step (default: none: the built-in workloads)")
    bench.add_argument("--script-args", metavar="ARGS",
                       help="the script's own arguments, one string split as a shell "
                            "would, e.g. \"--num-iters 3 --batch-size 16\" "
                            "(default: none)")
    bench.add_argument("--selection", action="store_true",
                       help="only time TopK selection (10M elements, 1%%) against abs and "
                            "torch.topk")
    bench.add_argument("--topk-bytes", action="store_true",
                       help="only count TopK's bytes per rank per step, uplink and "
                            "downlink, gathered and sharded, at 2, 4 and 8 ranks")
    bench.add_argument("--process-sets", action="store_true",
                       help="only measure DS-Sync's Horovod process sets: static against "
                            "dynamic registration, rotation against shuffle")
    bench.add_argument("--overlap", action="store_true",
                       help="only time decentralized SGD's step (one-peer exponential "
                            "graph, adapt-then-combine and combine-then-adapt) against the "
                            "same loop with the local optimizer only, on localhost "
                            "(--ranks; --steps per mode; --workloads)")
    bench.add_argument("--soak", action="store_true",
                       help="only run every strategy for --steps steps on "
                            "localhost at --ranks ranks and report memory growth and the "
                            "drift between ranks, for Horovod, TopK, DS-Sync and "
                            "decentralized SGD")


def run(args: argparse.Namespace) -> int:
    """Runs the measurement the parsed flags ask for; 0 on success."""
    from hvdx.bench.harness import run_bench
    from hvdx.bench.results import fastest_lines, render_table
    from hvdx.bench.run_list import check_placements, not_applicable
    from hvdx.bench.strategies import strategy_names
    from hvdx.bench.workloads import check_workloads
    from hvdx.cluster import ClusterSpec

    from hvdx.bench.script import split_items, variable_strategy
    from hvdx.bench.strategies import DEFAULT_STRATEGIES, FULL_STRATEGIES

    if args.strategies is None:
        args.strategies = ",".join(FULL_STRATEGIES if args.full else DEFAULT_STRATEGIES)
    items = strategy_names(split_items(args.strategies))  # fast, safe
    given = [item for item in items if variable_strategy(item) is not None]
    if given and not args.script:
        raise ValueError(f"--strategies {given[0]}: a variable's value runs with --script "
                         "only (the built-in workloads run the benchmark's strategies by "
                         "name)")
    args.strategies = ",".join(items)
    if args.workloads is None:
        args.workloads = FULL_WORKLOADS if args.full else QUICK_WORKLOADS
    # Before any cluster or rank starts: a misspelt name gets the list and the closest.
    check_workloads(args.workloads.split(","))

    say = lambda s: print(s, flush=True)  # noqa: E731
    if args.selection:
        from hvdx.bench.selection import measure, render

        print(render(measure()))
        return 0
    if args.process_sets:
        return _process_sets(args)
    if args.topk_bytes:
        from hvdx.bench.topk_bytes import render, run as run_topk

        rows = run_topk(steps=args.steps or 5, say=say)
        print("\nTopK 0.01/0.01 traffic on digits_vgg (hvdx's counters; localhost):")
        print(render(rows))
        return 0
    if args.overlap:
        from hvdx.bench.overlap import render, run as run_overlap

        rows = run_overlap(args.workloads.split(","), ranks=args.ranks,
                           steps=args.steps or 60, say=say, timeout=args.timeout)
        print(f"\nDecentralized SGD's exchange against no exchange (localhost, "
              f"{args.ranks} ranks, modes interleaved in one job):")
        print(render(rows))
        return 0
    if args.soak:
        from hvdx.bench.soak import render, run as run_soak

        rows = run_soak(ranks=args.ranks, steps=args.steps or 2000, say=say)
        print(f"\nSoak: {args.ranks} ranks on localhost, digits_cnn:")
        print(render(rows))
        return 0
    if args.script:
        return _script(args)
    placements = check_placements(args.placement.split(","))
    spec = None if args.localhost else ClusterSpec.from_args(args)
    # Planned (and the script checked) before the workloads' half hour, not after it.
    resnet50 = resnet50_plan(args) if args.full else None
    rows = run_bench(spec, args.workloads.split(","), args.strategies.split(","),
                     args.steps, args.eval_every, args.out,
                     ranks_per_host=args.ranks_per_host, localhost_ranks=args.ranks,
                     timeout=args.timeout, say=say, placements=placements,
                     floor=not args.no_floor, calibrate=not args.no_calibrate,
                     full=args.full)
    print()
    print(render_table(rows))
    for line in fastest_lines(rows) + not_applicable(args.workloads.split(","),
                                                     args.strategies.split(",")):
        print(line)
    print(f"\nwritten: {args.out}/results.json, results.csv, results.png")
    if resnet50 is not None:
        _run_resnet50(resnet50, args, spec, placements, say)
    return 0


@dataclass
class ScriptPlan:
    """A ``--script`` run that ``--full`` adds after the workloads: the script, its
    flags, the strategies (Horovod first), where its results go, and the notes to
    print (the strategies left out, and why; or why the whole run is left out, with
    ``script`` ``None``)."""

    script: Optional[str]
    script_args: List[str]
    strategies: List[str]
    out: str
    notes: List[str] = field(default_factory=list)


def resnet50_plan(args: argparse.Namespace) -> ScriptPlan:
    """What ``--full`` runs after the workloads: Horovod's PyTorch synthetic benchmark
    with ResNet-50 (:data:`SYNTHETIC_BENCHMARK`, :data:`RESNET50_ARGS`).

    Steps:
    1. find the script beside this hvdx (a checkout; an installed wheel has no
       ``examples/``: then the plan has no script and a note says how to run it);
    2. check that its Horovod import can be switched, as ``--script`` does before
       anything starts;
    3. keep, of the run's strategies (``--strategies``, default the full list), those
       the environment can switch a script to, Horovod first; the others are left out
       with a note each, never refused, since the workloads run them;
    4. put its results in ``<--out>/resnet50``, so that the workloads' files stay.
    """
    from hvdx.bench.script import script_strategies, split_items
    from hvdx.bench.script_run import prepare

    import hvdx

    root = os.path.dirname(os.path.dirname(os.path.abspath(hvdx.__file__)))
    path = os.path.join(root, SYNTHETIC_BENCHMARK)
    out = os.path.join(args.out, "resnet50")
    script_args = shlex.split(RESNET50_ARGS)
    if not os.path.isfile(path):
        return ScriptPlan(None, script_args, [], out, [
            f"Horovod's synthetic benchmark on ResNet-50 skipped: no {SYNTHETIC_BENCHMARK} "
            "beside this hvdx (a checkout of hvdx has it); run it with hvdx bench --script "
            f"PATH --script-args \"{RESNET50_ARGS}\""])
    prepare(path)
    strategies, notes = script_strategies(split_items(args.strategies), named=False)
    _note_no_floor(args, notes)
    return ScriptPlan(path, script_args, strategies, out, notes)


def _run_resnet50(plan: ScriptPlan, args: argparse.Namespace, spec, placements,
                  say) -> None:
    """``--full``'s ResNet-50 part: the planned ``--script`` run, its table printed."""
    from hvdx.bench.script_run import render_table, run_script_bench

    print()
    if plan.script is None:
        for note in plan.notes:
            print(f"note: {note}")
        return
    say(f"Horovod's PyTorch synthetic benchmark on ResNet-50, through --script: "
        f"{os.path.relpath(plan.script)} {RESNET50_ARGS}")
    rows = run_script_bench(spec, plan.script, plan.script_args, plan.strategies, plan.out,
                            ranks_per_host=args.ranks_per_host, localhost_ranks=args.ranks,
                            timeout=args.timeout, say=say, placements=placements,
                            notes=plan.notes)
    print()
    print("Horovod's PyTorch synthetic benchmark, ResNet-50 (img/sec: the median of its "
          "Iter lines, per rank; img x: over Horovod's):")
    print(render_table(rows))
    print(f"\nwritten: {plan.out}/results.json, results.csv, results.png")


def _note_no_floor(args: argparse.Namespace, notes: List[str]) -> None:
    """Says, where the floor was asked for, that a script cannot have one."""
    if not args.no_floor and "floor skipped" not in " ".join(notes):
        notes.append("no floor for a script: every rank training alone cannot be had "
                     "without changing it (its broadcasts and any metric allreduce still "
                     "communicate)")


def _script(args: argparse.Namespace) -> int:
    """``--script``: the user's Horovod script under Horovod and each strategy."""
    from hvdx.bench.run_list import check_placements
    from hvdx.bench.script import script_strategies, split_items
    from hvdx.bench.script_run import prepare, render_table, run_script_bench
    from hvdx.bench.strategies import DEFAULT_STRATEGIES
    from hvdx.cluster import ClusterSpec

    say = lambda s: print(s, flush=True)  # noqa: E731
    if args.steps is not None:
        raise ValueError("--steps does not apply to --script: the script decides its "
                         "steps; pass its own flags with --script-args")
    prepare(args.script)  # refused before anything starts
    named = args.strategies != ",".join(DEFAULT_STRATEGIES)
    strategies, notes = script_strategies(split_items(args.strategies), named)
    _note_no_floor(args, notes)
    placements = check_placements(args.placement.split(","))
    spec = None if args.localhost else ClusterSpec.from_args(args)
    script_args = shlex.split(args.script_args or "")
    rows = run_script_bench(spec, args.script, script_args, strategies, args.out,
                            ranks_per_host=args.ranks_per_host, localhost_ranks=args.ranks,
                            timeout=args.timeout, say=say, placements=placements,
                            notes=notes)
    print()
    print(render_table(rows))
    print(f"\nwritten: {args.out}/results.json, results.csv, results.png")
    return 0


def _process_sets(args: argparse.Namespace) -> int:
    """Static against dynamic Horovod process sets, rotation against shuffle (DS-Sync)."""
    from hvdx.bench.process_sets import render, run as run_sets
    from hvdx.cluster import ClusterSpec

    steps = args.steps or 64
    say = lambda s: print(s, flush=True)  # noqa: E731
    if args.localhost:
        rows = run_sets(ranks=args.ranks, steps=steps, say=say)
        where = f"localhost, {args.ranks} ranks"
    else:
        from hvdx.cluster import EmulatedCluster, mpiexec_command

        spec = ClusterSpec.from_args(args)
        with EmulatedCluster(spec) as cluster:
            rows = run_sets(ranks=len(cluster.hosts) * args.ranks_per_host, steps=steps,
                            launcher=lambda argv: mpiexec_command(cluster, argv,
                                                                  ppn=args.ranks_per_host),
                            say=say)
        where = f"emulated {spec.racks}x{spec.hosts_per_rack}, NIC {spec.nic}, uplink {spec.uplink}"
    print(f"\nDS-Sync process sets on {where} (median over {steps} steps; 1 M floats):")
    print(render(rows))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``hvdx bench`` as a program of its own (``python -m hvdx.bench.cli``)."""
    from hvdx.cli_help import DefaultsHelpFormatter

    parser = argparse.ArgumentParser(
        prog="hvdx bench", description="Train each workload under Horovod and every hvdx "
        "strategy on the same emulated cluster and compare step time, time to accuracy "
        "and bytes.", formatter_class=DefaultsHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ValueError as e:
        print(f"hvdx bench: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
