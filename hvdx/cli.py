"""The ``hvdx`` command line: ``info``, ``cluster``, ``bench``, ``plan`` and ``topology``.

``hvdx --version`` prints the version; ``--json`` on ``info``, ``plan`` and ``topology``
prints one JSON object instead of the text; every ``--help`` shows each option's
default (:mod:`hvdx.cli_help`). User notes: ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

__all__ = ["main", "build_parser"]


def _info(args: argparse.Namespace) -> int:
    from hvdx.info import collect, render, render_json

    rows = collect()
    print(render_json(rows) if args.json else render(rows))
    return 0


def _cluster(args: argparse.Namespace) -> int:
    """Create the emulated cluster, measure its links, optionally run an MPI job on it."""
    from hvdx.cluster import ClusterSpec, EmulatedCluster, format_rate, measure_bandwidth, run_mpi

    spec = ClusterSpec.from_args(args)  # every bad value is reported before anything exists
    with EmulatedCluster(spec) as cluster:
        for host in cluster.hosts:
            print(f"{host.name}: rack {host.rack}, data {host.data_addr}, netns {host.netns}")
        if args.probe:
            pairs = [("h0", "h1", "within a rack", spec.nic)]
            if spec.racks > 1:
                pairs.append(("h0", cluster.hosts[spec.hosts_per_rack].name, "across racks",
                               spec.uplink))
            for src, dst, where, configured in pairs:
                rate = measure_bandwidth(cluster, src, dst) * 8
                print(f"{src} -> {dst} ({where}): {format_rate(int(rate))} measured, "
                      f"{configured} configured")
        if args.command:
            command = args.command[1:] if args.command[0] == "--" else args.command
            proc = run_mpi(cluster, command, ppn=args.ranks_per_host, timeout=args.timeout,
                           capture_output=False)
            return proc.returncode
    return 0


def build_parser() -> argparse.ArgumentParser:
    from hvdx._version import __version__
    from hvdx.cli_help import DefaultsHelpFormatter
    from hvdx.cluster import add_cluster_arguments
    import hvdx.bench.cli
    import hvdx.info
    import hvdx.plan
    import hvdx.topology_cli

    parser = argparse.ArgumentParser(
        prog="hvdx", description="Network-aware synchronization for Horovod.",
        formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--version", action="version", version=__version__,
                        help="print hvdx's version and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    def add_parser(name: str, **kwargs) -> argparse.ArgumentParser:
        # Every subcommand's --help shows each option's default (hvdx.cli_help).
        return sub.add_parser(name, formatter_class=DefaultsHelpFormatter, **kwargs)

    info = add_parser("info", help="versions of hvdx, Horovod, frameworks and MPI; "
                                   "whether network emulation is available",
                      epilog=hvdx.info.JSON_KEYS)
    info.add_argument("--json", action="store_true",
                      help="print one JSON object instead of the text (keys below)")
    info.set_defaults(func=_info)

    cluster = add_parser(
        "cluster", help="emulate racks of hosts with shaped links (root); run an MPI job there",
        description="Create an emulated cluster, print its hosts, optionally measure its "
                    "links and run a command as an MPI job across it, then remove it all.")
    add_cluster_arguments(cluster)
    cluster.add_argument("--probe", action="store_true", help="measure link bandwidths")
    cluster.add_argument("--ranks-per-host", type=int, default=1, help="MPI ranks per host")
    cluster.add_argument("--timeout", type=float, default=3600.0,
                         help="seconds before the MPI job is killed")
    cluster.add_argument("command", nargs=argparse.REMAINDER,
                         help="-- PROGRAM ARGS...: run as an MPI job, one rank per host")
    cluster.set_defaults(func=_cluster)

    bench = add_parser(
        "bench", help="every strategy against Horovod on the emulated cluster",
        description="Train each workload under Horovod and every hvdx strategy on the same "
                    "emulated cluster and compare step time, time to accuracy and bytes.")
    hvdx.bench.cli.add_arguments(bench)
    bench.set_defaults(func=hvdx.bench.cli.run)

    plan = add_parser("plan", help="predict which strategy wins on a network (alpha-beta)",
                      description="Price one step of every strategy with the alpha-beta "
                                  "cost model and name the fastest; strategies hvdx does "
                                  "not implement are marked (model only).",
                      epilog=hvdx.plan.JSON_KEYS)
    hvdx.plan.add_arguments(plan)
    plan.set_defaults(func=hvdx.plan.run_plan)

    topology = add_parser(
        "topology", help="hosts, racks, measured bandwidths and the DS-Sync rotation of a job",
        description="Run under mpirun (rank 0 prints), or with emulated-cluster flags to "
                    "build that cluster and run there: prints the hosts, the racks, with "
                    "--probe the bandwidth of every pair of ranks and the slow links, "
                    "the DS-Sync rotation for that topology, and the HVDX_RACK (per host) "
                    "and HVDX_LINK_RATES to set on a real cluster for the same topology.",
        epilog=hvdx.topology_cli.JSON_KEYS)
    hvdx.topology_cli.add_arguments(topology)
    topology.set_defaults(func=hvdx.topology_cli.run_topology)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        # Bad input: one clear line, no traceback, nothing created.
        print(f"hvdx {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
