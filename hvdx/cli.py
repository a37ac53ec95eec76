"""The ``hvdx`` command line: ``info``, ``cluster``, ``bench``, ``plan`` and ``topology``."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

__all__ = ["main", "build_parser"]


def _info(args: argparse.Namespace) -> int:
    from hvdx.info import collect, render

    print(render(collect()))
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


def _bench(args: argparse.Namespace) -> int:
    from hvdx.bench.harness import render_table, run_bench
    from hvdx.cluster import ClusterSpec

    if args.selection:
        from hvdx.bench.selection import measure, render

        print(render(measure()))
        return 0
    if args.process_sets:
        return _bench_process_sets(args)
    if args.topk_bytes:
        from hvdx.bench.topk_bytes import render, run

        rows = run(steps=args.steps or 5, say=lambda s: print(s, flush=True))
        print("\nTopK 0.01/0.01 traffic on digits_vgg (hvdx's counters; localhost):")
        print(render(rows))
        return 0
    spec = None if args.localhost else ClusterSpec.from_args(args)
    rows = run_bench(spec, args.workloads.split(","), args.strategies.split(","),
                     args.steps, args.eval_every, args.out,
                     ranks_per_host=args.ranks_per_host, localhost_ranks=args.ranks,
                     timeout=args.timeout, say=lambda s: print(s, flush=True))
    print()
    print(render_table(rows))
    print(f"\nwritten: {args.out}/results.json, results.csv, results.png")
    return 0


def _bench_process_sets(args: argparse.Namespace) -> int:
    """Static against dynamic Horovod process sets, rotation against shuffle (DS-Sync)."""
    from hvdx.bench.process_sets import render, run
    from hvdx.cluster import ClusterSpec

    steps = args.steps or 64
    if args.localhost:
        rows = run(ranks=args.ranks, steps=steps, say=lambda s: print(s, flush=True))
        where = f"localhost, {args.ranks} ranks"
    else:
        from hvdx.cluster import EmulatedCluster, mpiexec_command

        spec = ClusterSpec.from_args(args)
        with EmulatedCluster(spec) as cluster:
            rows = run(ranks=len(cluster.hosts) * args.ranks_per_host, steps=steps,
                       launcher=lambda argv: mpiexec_command(cluster, argv,
                                                             ppn=args.ranks_per_host),
                       say=lambda s: print(s, flush=True))
        where = f"emulated {spec.racks}x{spec.hosts_per_rack}, NIC {spec.nic}, uplink {spec.uplink}"
    print(f"\nDS-Sync process sets on {where} (median over {steps} steps; 1 M floats):")
    print(render(rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from hvdx.bench.strategies import DEFAULT_STRATEGIES, STRATEGIES
    from hvdx.cluster import add_cluster_arguments
    import hvdx.plan
    import hvdx.topology_cli

    parser = argparse.ArgumentParser(
        prog="hvdx", description="Network-aware synchronization for Horovod.")
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="versions of hvdx, Horovod, frameworks and MPI; "
                                       "whether network emulation is available")
    info.set_defaults(func=_info)

    cluster = sub.add_parser(
        "cluster", help="emulate racks of hosts with shaped links (root); run an MPI job there",
        description="Create an emulated cluster, print its hosts, optionally measure its "
                    "links and run a command as an MPI job across it, then remove it all.")
    add_cluster_arguments(cluster)
    cluster.add_argument("--probe", action="store_true", help="measure link bandwidths")
    cluster.add_argument("--ranks-per-host", type=int, default=1)
    cluster.add_argument("--timeout", type=float, default=3600.0,
                         help="seconds before the MPI job is killed")
    cluster.add_argument("command", nargs=argparse.REMAINDER,
                         help="-- PROGRAM ARGS...: run as an MPI job, one rank per host")
    cluster.set_defaults(func=_cluster)

    bench = sub.add_parser(
        "bench", help="every strategy against Horovod on the emulated cluster",
        description="Train each workload under Horovod and every hvdx strategy on the same "
                    "emulated cluster and compare step time, time to accuracy and bytes.")
    add_cluster_arguments(bench)
    bench.add_argument("--localhost", action="store_true",
                       help="no emulated cluster: ranks on this host, shared memory")
    bench.add_argument("--ranks", type=int, default=4, help="ranks with --localhost (4)")
    bench.add_argument("--ranks-per-host", type=int, default=1)
    bench.add_argument("--workloads", default="digits_vgg,digits_cnn")
    bench.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES),
                       help=f"comma-separated, from {','.join(STRATEGIES)}")
    bench.add_argument("--steps", type=int, help="training steps (default per workload)")
    bench.add_argument("--eval-every", type=int, default=5)
    bench.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    bench.add_argument("--out", default="results/bench", help="output directory")
    bench.add_argument("--selection", action="store_true",
                       help="only time TopK selection (10M elements, 1%%) against abs and "
                            "torch.topk")
    bench.add_argument("--topk-bytes", action="store_true",
                       help="only count TopK's bytes per rank per step, uplink and "
                            "downlink, gathered and sharded, at 2, 4 and 8 ranks")
    bench.add_argument("--process-sets", action="store_true",
                       help="only measure DS-Sync's Horovod process sets: static against "
                            "dynamic registration, rotation against shuffle")
    bench.set_defaults(func=_bench)

    plan = sub.add_parser("plan", help="predict which strategy wins on a network (alpha-beta)")
    hvdx.plan.add_arguments(plan)
    plan.set_defaults(func=hvdx.plan.run_plan)

    topology = sub.add_parser(
        "topology", help="hosts, racks, measured bandwidths and the DS-Sync rotation of a job",
        description="Run under mpirun (rank 0 prints), or with emulated-cluster flags to "
                    "build that cluster and run there: prints the hosts, the racks, with "
                    "--probe the bandwidth of every pair of ranks and the slow links, "
                    "and the DS-Sync rotation for that topology.")
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
