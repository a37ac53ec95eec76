"""``hvdx plan``: which strategy should win on this network, before any run.

Prices one step of every strategy with the alpha-beta model of
:mod:`hvdx.core.cost_model` and prints a table and a verdict; ``--sweep`` repeats that
for several uplink rates (or oversubscription ratios) and prints the winner at each.
The numbers are predictions, to be checked against measured runs.

Example::

    hvdx plan --preset datacenter --params 138e6 --fc-fraction 0.9 --compute-ms 100
    hvdx plan --preset emulated --sweep 10mbit,100mbit,1gbit
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from typing import Dict, List, Optional, Sequence

from hvdx.core.cost_model import (
    DEFAULT_STRATEGIES,
    PLACEMENTS,
    Cluster,
    Prediction,
    Workload,
    compare,
    format_rate,
    parse_rate,
    parse_time,
    predict,
    speedup,
)

__all__ = ["PRESETS", "add_arguments", "build_cluster", "build_workload", "main", "run_plan"]

#: Clusters by name; flags given explicitly override them.
PRESETS: Dict[str, Dict[str, object]] = {
    # What hvdx.cluster emulates by default: 2 racks x 2 hosts behind a slow core link.
    "emulated": {"racks": 2, "hosts_per_rack": 2, "nic": "1gbit", "uplink": "100mbit"},
    # 8 racks x 32 single-GPU hosts, 25 Gbit NICs, 4:1 oversubscribed uplinks.
    "datacenter": {"racks": 8, "hosts_per_rack": 32, "nic": "25gbit", "oversubscription": 4.0},
}

_DEFAULT_SWEEP = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ``hvdx plan`` flags to ``parser``."""
    net = parser.add_argument_group("cluster (a preset, overridden by any flag given)")
    net.add_argument("--preset", choices=sorted(PRESETS), default="datacenter",
                     help="base cluster (default: datacenter)")
    net.add_argument("--racks", type=int, help="number of racks")
    net.add_argument("--hosts-per-rack", type=int, help="hosts per rack")
    net.add_argument("--ranks-per-host", type=int, help="ranks (GPUs) per host (default 1)")
    net.add_argument("--nic", metavar="RATE", help="host NIC rate, e.g. 25gbit")
    net.add_argument("--uplink", metavar="RATE", help="rack uplink rate, e.g. 100mbit")
    net.add_argument("--oversubscription", type=float,
                     help="hosts_per_rack * nic / uplink, e.g. 4 (instead of --uplink)")
    net.add_argument("--latency", metavar="TIME", default="25us",
                     help="per-message latency alpha (default 25us)")
    net.add_argument("--intra-host", metavar="RATE",
                     help="rate between ranks of one host (default: not a bottleneck)")
    net.add_argument("--placement", choices=PLACEMENTS, default="blocked",
                     help="how ranks fill the hosts: blocked (rack by rack, default) or "
                          "interleaved (one host of each rack in turn: rank r in rack "
                          "r mod racks, so the long hops of the exponential graphs stay "
                          "inside racks)")
    work = parser.add_argument_group("workload (defaults: VGG-16)")
    work.add_argument("--params", type=float, default=138e6, help="parameters (138e6)")
    work.add_argument("--fc-fraction", type=float, default=0.9,
                      help="share of parameters in FC layers (0.9)")
    work.add_argument("--compute-ms", type=float, default=100.0,
                      help="compute per step on one rank, ms (100)")
    work.add_argument("--bytes-per-element", type=int, default=4, help="4 for float32")
    work.add_argument("--batch-size", type=int, default=32, help="samples per rank (32)")
    work.add_argument("--activation-size", type=int, default=25088,
                      help="elements per sample at the conv/FC boundary (25088)")
    work.add_argument("--fc-compute-fraction", type=float, default=0.01,
                      help="share of compute in the FC layers (0.01)")
    opts = parser.add_argument_group("strategy options")
    opts.add_argument("--ratio", type=float, default=0.01, help="topk: uplink ratio (0.01)")
    opts.add_argument("--downlink-ratio", type=float, help="topk sharded: default --ratio")
    opts.add_argument("--intra-phases", type=int, default=1,
                      help="dssync: intra-rack phases per cross-rack phase (1)")
    opts.add_argument("--cross-ranks", type=int,
                      help="dssync: ranks per rack in a cross phase (default: all)")
    opts.add_argument("--fc-workers", type=int, default=1, help="stanza: FC workers (1)")
    opts.add_argument("--mix-every", type=int, default=1,
                      help="decentralized: mix every N steps, local steps between (1)")
    parser.add_argument("--sweep", nargs="?", const="default", metavar="VALUES",
                        help="comma-separated uplink rates (100mbit,1gbit) or oversubscription "
                             "ratios (1,4,16); alone: ratios 1 to 64")


def build_cluster(args: argparse.Namespace) -> Cluster:
    """The preset's cluster with every explicitly given flag applied."""
    base = dict(PRESETS[args.preset])
    for key in ("racks", "hosts_per_rack", "nic", "uplink", "oversubscription"):
        if getattr(args, key) is not None:
            base[key] = getattr(args, key)
    if args.uplink is not None and args.oversubscription is not None:
        raise ValueError(f"--uplink={args.uplink!r} and --oversubscription="
                         f"{args.oversubscription!r}: give one of them")
    if args.uplink is not None or args.oversubscription is not None:
        base.pop("oversubscription" if args.uplink is not None else "uplink", None)
    extra = {"ranks_per_host": 1 if args.ranks_per_host is None else args.ranks_per_host,
             "latency_s": parse_time(args.latency, "--latency"),
             "intra_host_bps": None if args.intra_host is None
             else parse_rate(args.intra_host, "--intra-host"),
             "placement": args.placement}
    nic = parse_rate(base["nic"], "--nic")
    if "oversubscription" in base:
        return Cluster.from_oversubscription(base["racks"], base["hosts_per_rack"], nic,
                                             base["oversubscription"], **extra)
    return Cluster(racks=base["racks"], hosts_per_rack=base["hosts_per_rack"], nic_bps=nic,
                   uplink_bps=parse_rate(base["uplink"], "--uplink"), **extra)


def build_workload(args: argparse.Namespace) -> Workload:
    """The workload described by the flags."""
    return Workload.from_total(
        args.params, args.fc_fraction, args.compute_ms / 1e3,
        bytes_per_element=args.bytes_per_element, batch_size=args.batch_size,
        activation_size=args.activation_size, fc_compute_fraction=args.fc_compute_fraction)


def _options(args: argparse.Namespace) -> Dict[str, object]:
    options = {"ratio": args.ratio, "intra_phases": args.intra_phases,
               "fc_workers": args.fc_workers, "mix_every": args.mix_every}
    if args.downlink_ratio is not None:
        options["downlink_ratio"] = args.downlink_ratio
    if args.cross_ranks is not None:
        options["cross_ranks"] = args.cross_ranks
    return options


def _describe(c: Cluster, w: Workload) -> str:
    return (f"cluster: {c.racks} racks x {c.hosts_per_rack} hosts x {c.ranks_per_host} "
            f"rank(s) = {c.ranks} ranks; NIC {format_rate(c.nic_bps)}, uplink "
            f"{format_rate(c.uplink_bps)} ({c.oversubscription:g}:1), latency "
            f"{c.latency_s * 1e6:g}us, {c.placement} placement\n"
            f"workload: {w.params / 1e6:g}M params ({w.fc_params / 1e6:g}M FC), "
            f"{w.bytes_per_element} B each, compute {w.compute_s * 1e3:g} ms/step, "
            f"batch {w.batch_size}, activations {w.activation_size}/sample")


def _table(predictions: List[Prediction], baseline: Prediction) -> str:
    rows = [("strategy", "step ms", "comm ms", "MB/rank/step", "bottleneck", "vs horovod")]
    rows += [(p.label, f"{p.step_s * 1e3:.1f}", f"{p.comm_s * 1e3:.1f}",
              f"{p.bytes_per_rank / 1e6:.2f}", p.bottleneck, f"{speedup(p, baseline):.2f}x")
             for p in predictions]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                               for i, (cell, width) in enumerate(zip(row, widths)))
                     for row in rows)


def _verdict(predictions: List[Prediction], baseline: Prediction) -> str:
    best = predictions[0]
    if best.strategy == "horovod":
        return "verdict: horovod wins; no hvdx strategy is predicted to pay here"
    return (f"verdict: {best.label} wins, {speedup(best, baseline):.2f}x horovod per batch "
            f"({best.step_s * 1e3:.1f} ms/step, bottleneck {best.bottleneck})")


def _sweep_uplink(value: str, base: Cluster) -> float:
    """A plain number is an oversubscription ratio, anything else an uplink rate."""
    try:
        ratio = float(value)
    except ValueError:
        return parse_rate(value, "--sweep")
    if not 0 < ratio < math.inf:
        raise ValueError(f"--sweep={value!r} must be a positive ratio (e.g. 4) or a rate")
    return base.hosts_per_rack * base.nic_bps / ratio


def _sweep_points(text: str, base: Cluster) -> List[Cluster]:
    """``base`` with each uplink of the comma-separated ``text`` (``"default"``: 1:1 to 64:1)."""
    values = [f"{v:g}" for v in _DEFAULT_SWEEP] if text == "default" else \
        [v.strip() for v in text.split(",") if v.strip()]
    if not values:
        raise ValueError(f"--sweep={text!r} names no values")
    return [dataclasses.replace(base, uplink_bps=_sweep_uplink(v, base)) for v in values]


def _sweep(points: List[Cluster], workload: Workload,
           options: Dict[str, object]) -> str:
    """One column per sweep point, one row per strategy, then the winner at each point."""
    # compare() one strategy at a time keeps the rows in DEFAULT_STRATEGIES order.
    columns = [[compare(cluster, workload, [entry], **options)[0]
                for entry in DEFAULT_STRATEGIES] for cluster in points]
    table = [["uplink"] + [format_rate(c.uplink_bps) for c in points],
             ["oversubscription"] + [f"{c.oversubscription:g}:1" for c in points]]
    for i, first in enumerate(columns[0]):
        table.append([f"{first.label}, step ms"]
                     + [f"{column[i].step_s * 1e3:.1f}" for column in columns])
    widths = [max(len(row[j]) for row in table) for j in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(width) if j == 0 else cell.rjust(width)
                       for j, (cell, width) in enumerate(zip(row, widths))) for row in table]
    for cluster, column in zip(points, columns):
        best = min(column, key=lambda p: p.seconds_per_batch)
        baseline = next(p for p in column if p.strategy == "horovod")
        lines.append(f"winner at uplink {format_rate(cluster.uplink_bps)} "
                     f"({cluster.oversubscription:g}:1): {best.label}, "
                     f"{speedup(best, baseline):.2f}x horovod per batch")
    return "\n".join(lines)


def run_plan(args: argparse.Namespace) -> int:
    """Prints the prediction (or the sweep) for parsed ``hvdx plan`` arguments.

    Returns:
        0, or 2 after printing the message of a bad value to stderr.
    """
    try:
        cluster, workload, options = build_cluster(args), build_workload(args), _options(args)
        if args.sweep is not None:
            report = _sweep(_sweep_points(args.sweep, cluster), workload, options)
        else:
            ranked = compare(cluster, workload, DEFAULT_STRATEGIES, **options)
            baseline = predict("horovod", cluster, workload)
            report = "\n".join([
                _table(ranked, baseline),
                f"(speedups compare time per batch: stanza trains on "
                f"{cluster.ranks - args.fc_workers} of {cluster.ranks} ranks)",
                _verdict(ranked, baseline)])
    except ValueError as error:
        print(f"hvdx plan: error: {error}", file=sys.stderr)
        return 2
    print(_describe(cluster, workload))
    print(report)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``hvdx plan`` as a program of its own (``python -m hvdx.plan``)."""
    parser = argparse.ArgumentParser(prog="hvdx plan", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_plan(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
