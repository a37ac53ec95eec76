"""``hvdx plan``: which strategy should win on this network, before any run.

Prices one step of every strategy with the alpha-beta model of
:mod:`hvdx.core.cost_model` and prints a table and a verdict; ``--sweep`` repeats that
for several uplink rates (or oversubscription ratios) and prints the winner at each.
The numbers are predictions, to be checked against measured runs. Strategies the model
prices but hvdx does not implement (:data:`hvdx.planning.run_lines.MODEL_ONLY`) are
marked "(model only)". This module is the command (its flags, and what it prints); its
parts are in :mod:`hvdx.planning`.

Example::

    hvdx plan --preset datacenter --params 138e6 --fc-fraction 0.9 --compute-ms 100
    hvdx plan --preset emulated --sweep 10mbit,100mbit,1gbit
    hvdx plan --preset emulated --json
    mpirun -n 4 hvdx plan --calibrate calibration.json     # measure, on the cluster
    hvdx plan --racks 2 --hosts-per-rack 2 --nic 1gbit --uplink 100mbit \
        --calibration calibration.json --params 1.37e6 --compute-ms 30

``--calibrate FILE``, run as an MPI job over the cluster's hosts, times exchange rounds
on each link class (:mod:`hvdx.mpi.calibrate`) and writes them to FILE;
``--calibration FILE`` prices every strategy from those measurements instead of the
rates and ``--latency`` (:class:`hvdx.core.calibration.Calibration`), with an
allreduce laid out as the MPI library runs it. The cluster flags must describe the
cluster the file was measured on. ``--local-steps horovod=140ms,topk=135ms,...`` gives
each strategy's step measured with every rank on one host (``hvdx bench --localhost``),
which then replaces ``--compute-ms`` for it: the phases are added to it.
``--local-waits topk=35ms,...`` gives the part of each such step its ranks spent waiting
in hvdx's own exchanges (``hvdx_wait_s`` in ``hvdx bench``'s results), and
``--local-cores`` the cores its ranks shared: with more ranks than cores, the earlier
ranks' share of the wire crosses during that wait, and is not added again
(:func:`hvdx.core.cost_model.predict`).

Under the table, each row's ``to run`` line is what a script writes to get it: the
argument of ``DistributedOptimizer`` (``HVDX_COMPRESSION`` / ``HVDX_SYNC`` take the same
call), and the preset (``HVDX_COMPRESSION=fast``) where one sends the same bytes.

``--json`` prints one object built from the same figures as the text, which rounds
them; its keys are :data:`JSON_KEYS` (also the epilog of ``hvdx plan --help``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from hvdx.cli_help import DefaultsHelpFormatter
from hvdx.core.cost_model import PLACEMENTS
from hvdx.planning.figures import report
from hvdx.planning.flags import PRESETS, parse_params, plan_options
from hvdx.planning.text import render

__all__ = ["JSON_KEYS", "add_arguments", "main", "run_plan"]

#: The keys of ``--json``'s object, for the docs and ``--help``.
JSON_KEYS = (
    "--json keys: 'cluster' (racks, hosts_per_rack, ranks_per_host, ranks, nic_bps and "
    "uplink_bps in bits/s, oversubscription, latency_s, intra_host_bps (null: not a "
    "bottleneck), placement, calibration (where --calibration was measured, or null)); 'workload' (params, fc_params, bytes_per_element, "
    "compute_ms, batch_size, activation_size); without --sweep, 'strategies': the table's "
    "rows, fastest first, each with strategy (the cost model's key), label, model_only, "
    "step_ms, compute_ms (the compute or --local-steps' step it holds), comm_ms, hidden_ms (of comm_ms, what runs inside --local-waits), "
    "mb_per_rank_per_step, bottleneck, vs_horovod (speedup per batch), "
    "data_ranks (ranks that train) and run (what a script writes to run it, as the text's "
    "'to run' lines; null for a model-only strategy), and 'verdict': label, strategy, vs_horovod, "
    "step_ms and bottleneck of the fastest hvdx strategy, faster_model_only (labels "
    "of model-only strategies predicted faster still), tied (labels of the strategies "
    "within the plan's 20% error of it per batch), wire_share (of its step, the wire "
    "nothing hides) and compute_bound (wire_share under 25%: with any tie, the text "
    "then calls no winner); with --sweep, 'sweep': one entry "
    "per point with uplink_bps, oversubscription, strategies (rows as above, in the "
    "table's order) and winner (as verdict).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ``hvdx plan`` flags to ``parser``."""
    net = parser.add_argument_group("cluster (a preset, overridden by any flag given)")
    net.add_argument("--preset", choices=sorted(PRESETS), default="datacenter",
                     help="base cluster")
    net.add_argument("--racks", type=int, help="number of racks (default: from --preset)")
    net.add_argument("--hosts-per-rack", type=int,
                     help="hosts per rack (default: from --preset)")
    net.add_argument("--ranks-per-host", type=int, default=1, help="ranks (GPUs) per host")
    net.add_argument("--nic", metavar="RATE",
                     help="host NIC rate, e.g. 25gbit (default: from --preset)")
    net.add_argument("--uplink", metavar="RATE",
                     help="rack uplink rate, e.g. 100mbit (default: from --preset)")
    net.add_argument("--oversubscription", type=float,
                     help="hosts_per_rack * nic / uplink, e.g. 4, instead of --uplink "
                          "(default: from --preset)")
    net.add_argument("--latency", metavar="TIME", default="25us",
                     help="per-message latency alpha, with its unit: 25us, 5ms, 0.005s "
                          "(a bare number is seconds; 1 or more is refused as a "
                          "forgotten unit)")
    net.add_argument("--intra-host", metavar="RATE",
                     help="rate between ranks of one host (default: not a bottleneck)")
    net.add_argument("--placement", choices=PLACEMENTS, default="blocked",
                     help="how ranks fill the hosts: blocked (rack by rack) or "
                          "interleaved (one host of each rack in turn: rank r in rack "
                          "r mod racks, so the long hops of the exponential graphs stay "
                          "inside racks)")
    # String defaults go through `type` too: the help shows 138e6, the value is a float.
    work = parser.add_argument_group("workload (the defaults are VGG-16)")
    work.add_argument("--params", type=parse_params, metavar="COUNT", default="138e6",
                      help="parameters, e.g. 138M, 1.37e6 (K, M, G: 1e3, 1e6, 1e9)")
    work.add_argument("--fc-fraction", type=float, default=0.9,
                      help="share of parameters in FC layers")
    work.add_argument("--compute-ms", type=float, default=100.0,
                      help="compute per step on one rank, ms")
    work.add_argument("--bytes-per-element", type=int, default=4,
                      help="bytes per parameter, 4 for float32")
    work.add_argument("--batch-size", type=int, default=32, help="samples per rank")
    work.add_argument("--activation-size", type=int, default=25088,
                      help="elements per sample at the conv/FC boundary")
    work.add_argument("--fc-compute-fraction", type=float, default=0.01,
                      help="share of compute in the FC layers")
    opts = parser.add_argument_group("strategy options")
    for option in plan_options():  # each strategy's, from the catalogue
        opts.add_argument(option.flag, type=option.type, default=option.default,
                          help=option.help)
    parser.add_argument("--sweep", nargs="?", const="default", metavar="VALUES",
                        help="comma-separated uplink rates (100mbit,1gbit) or oversubscription "
                             "ratios (1,4,16); alone: ratios 1 to 64 (default: no sweep)")
    cal = parser.add_argument_group("calibration (measured on the actual cluster)")
    cal.add_argument("--calibrate", metavar="FILE",
                     help="run as an MPI job on the cluster (mpirun -n N hvdx plan "
                          "--calibrate FILE): time exchange rounds on every link class "
                          "and write them to FILE, then stop (default: no calibration run)")
    cal.add_argument("--calibration", metavar="FILE",
                     help="price every strategy from the rounds measured in FILE (written "
                          "by --calibrate on this cluster) instead of the rates and "
                          "--latency (default: none: the rates alone)")
    cal.add_argument("--local-steps", metavar="KEY=TIME,...",
                     help="each strategy's step measured with every rank on one host "
                          "(e.g. horovod=131ms,topk=142ms; `hvdx bench --localhost` "
                          "measures them): it replaces the modelled compute, and the "
                          "cluster's phases are added to it (default: none: the compute)")
    cal.add_argument("--local-waits", metavar="KEY=TIME,...",
                     help="of each --local-steps step, the time its ranks waited in hvdx's "
                          "exchanges (e.g. topk=35ms; hvdx_wait_s in `hvdx bench`'s results): "
                          "with more ranks than --local-cores, the earlier ranks' share of "
                          "the wire crosses during it and is not added again (default: "
                          "none: the phases are added whole)")
    cal.add_argument("--local-cores", metavar="N", type=int,
                     help="the cores the ranks of the --local-waits runs shared (default: "
                          "this machine's)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of the text: the same figures, "
                             "unrounded (keys below)")


def run_plan(args: argparse.Namespace) -> int:
    """Prints the prediction (or the sweep) for parsed ``hvdx plan`` arguments, as text
    or, with ``--json``, as one JSON object.

    Returns:
        0, or 2 after printing the message of a bad value to stderr.
    """
    if getattr(args, "calibrate", None):
        return _run_calibration(args.calibrate)
    try:
        figures = report(args)
    except ValueError as error:
        print(f"hvdx plan: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(figures) if args.json else render(figures))
    return 0


def _run_calibration(path: str) -> int:
    """``--calibrate FILE``: every rank of the MPI job measures; rank 0 writes FILE."""
    from mpi4py import MPI

    from hvdx.mpi.calibrate import calibrate
    from hvdx.mpi.calibration_set_averages import with_set_averages

    world = MPI.COMM_WORLD
    say = (lambda s: print(s, flush=True)) if world.Get_rank() == 0 else None  # noqa: E731
    if world.Get_size() < 2:
        if say:
            say("hvdx plan: error: --calibrate measures links between ranks: run it as an "
                "MPI job over the cluster's hosts, e.g. mpirun -n 4 -ppn 1 hvdx plan "
                f"--calibrate {path}")
        return 2
    calibration = with_set_averages(calibrate(say=say), say=say)
    if say:
        calibration.save(path)
        say(f"written: {path} ({calibration.source}); use it with hvdx plan --calibration "
            f"{path} and the cluster's flags")
    world.Barrier()
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``hvdx plan`` as a program of its own (``python -m hvdx.plan``)."""
    parser = argparse.ArgumentParser(prog="hvdx plan", description=__doc__.splitlines()[0],
                                     epilog=JSON_KEYS, formatter_class=DefaultsHelpFormatter)
    add_arguments(parser)
    return run_plan(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
