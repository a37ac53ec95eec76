"""Calibration job: time exchange rounds per link class on the cluster a job runs on.

What :class:`hvdx.core.calibration.Calibration` holds, measured as the rounds of MPI's
collectives run: every pair of a round exchanges the same message both ways at once
(``Isend`` and ``Irecv``, waited for with yields, then sleeps, as hvdx's own exchanges
wait: :func:`hvdx.mpi.sparse.wait_all`), and every measured flow count is a number of
pairs whose traffic shares one link. Collective over ``comm``:

1. hosts from the shared-memory split, racks from ``HVDX_RACK`` / ``HVDX_CLUSTER_RACK``
   (:mod:`hvdx.mpi.topology`; no label: one rack);
2. the pair sets: ``"uplink"`` (between the first two racks; ``c`` pairs, one rank per
   host on each side, share each rack's uplink, for ``c = 1, 2, 4, ...`` up to the
   hosts of the smaller rack), ``"nic"`` (hosts of one rack paired, every rack at once:
   one flow per NIC, and ``ranks_per_host`` flows with several ranks per host),
   ``"intra-host"`` (ranks of one host paired);
3. for each pair set and each size of :data:`DEFAULT_SIZES` in turn: one unrecorded
   exchange (connections are set up lazily), then ``repeats`` batches (three times as
   many up to 128 KiB), each a barrier and ``k`` exchanges back to back (8 up to
   128 KiB, else 2), timed by the slowest rank and divided by ``k``; the median batch is
   kept. A small round takes milliseconds, and one rank descheduled on shared cores
   stretches its batch tenfold: with three batches, 128 KiB across a 1 Gbit NIC once
   read 19 ms where it takes 2 (more than 1 MiB took in the same run). Ranks outside
   the exchange wait for it with sleeps, not spinning in MPI (where ranks outnumber
   cores, a spinning idle rank takes a core from those exchanging). Back to back, each
   exchange waits for the partner's previous one, as the dependent rounds of a
   collective do; a single exchange after a barrier would not: a small message is sent
   eagerly, and a rank that leaves the barrier late finds its partner's data already
   there. Sizes stop growing
   once a round of 4 MiB or more took over ``max_round_s``: the slope is known by then
   and the cost model extrapolates it;
4. the shifts (``"uplink"``: a directed ring through ``c`` ranks of each of the first two
   racks, alternating racks, so that ``c`` flows cross the uplink each way on different
   connections; ``"nic"``: a directed ring through the hosts of each rack), each rank
   sending to its successor while receiving from its predecessor, timed as in step 3;
5. the one-way rounds (the swaps' pairs of step 2, the first rank of each pair sending
   and the second receiving, nothing coming back), timed as in step 3: a link that
   carries data one way only moves it faster than a swap or a shift through it;
6. the MPI allreduce itself (float32, sum) on the groups the strategies use
   (:data:`~hvdx.core.calibration.ALLREDUCE_GROUPS`: all ranks; each rack's ranks, all
   racks at once; one rank per rack, every such group at once), timed as in step 3
   for the sizes of :data:`~hvdx.mpi.calibration_collectives.ALLREDUCE_SIZES`;
7. hvdx's sparse allgather and alltoall (:func:`hvdx.mpi.sparse.allgatherv_pairs`,
   :func:`~hvdx.mpi.sparse.alltoallv_pairs`, as TopK calls them) on all ranks, timed as
   in step 3 for the sizes of :data:`SPARSE_SIZES` per rank (an alltoall's pieces are
   equal, one per rank); then sharded TopK's step, the alltoall of each of those sizes
   followed by the allgather of a downlink ``m`` times as dense (``m`` in
   :data:`SHARDED_DOWNLINK_MULTIPLES`: ``m / n`` of the size per rank), timed once
   after a barrier rather than back to back, as the step runs it once after compute
   (:func:`~hvdx.mpi.calibration_timing.timed_points` with ``once``; the median of
   ``4 * repeats`` runs, ``12 * repeats`` up to 128 KiB);
8. every rank returns the same :class:`~hvdx.core.calibration.Calibration`; the
   allreduce algorithm is MPICH's recursive halving when the library is MPICH;
9. where Horovod for PyTorch is installed (:func:`with_set_averages`, which the job
   runs after step 8), the average DS-Sync runs, Horovod's grouped allreduce on
   process sets with dynamic registration, timed once after a barrier as in step 7
   but keeping the mean of ``4 * repeats`` runs (its times have two modes), for the
   sizes of :data:`SET_ALLREDUCE_SIZES` on the group DS-Sync averages in most steps: each
   rack's set, every rack at once, with the crossing sets registered too (the table
   Horovod agrees on every cycle is DS-Sync's); on one rack, everyone (Horovod's
   global set). DS-Sync's crossing average is left to step 6: its time is the
   uplink's, which MPI's allreduce measures as well, and timing it again through a
   slow uplink would add a minute. With several racks, Horovod's own average on all
   ranks is timed too, the same way, up to
   :data:`~hvdx.mpi.calibration_set_averages.WORLD_AVERAGE_MAX_BYTES`: below it
   Horovod's step is mostly its machinery on these cores rather than the wire. Each
   average is named, as DS-Sync names its own,
   and run three times untimed first, so that the timed runs are answered from Horovod's
   response cache as DS-Sync's are in every step after its first.

This module runs the steps (:func:`calibrate`, :func:`main`); their parts have modules
of their own: the pairs of steps 2, 4 and 5 (:mod:`hvdx.mpi.calibration_pairs`), the
timing of step 3 (:mod:`hvdx.mpi.calibration_timing`), the collectives of steps 6 and 7
(:mod:`hvdx.mpi.calibration_collectives`) and Horovod's averages of step 9
(:mod:`hvdx.mpi.calibration_set_averages`).

Run it as ``mpirun -n N hvdx plan --calibrate FILE``; ``hvdx bench`` runs it on its
emulated cluster before the workloads (``python -m hvdx.mpi.calibrate --out FILE``),
and again around the runs priced by step 9's averages (DS-Sync's) or by the end of step
7 (each sharded TopK's), timing only those (:func:`main`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from hvdx.core.calibration import Calibration
from hvdx.mpi import sparse
from hvdx.mpi.calibration_collectives import (
    SHARDED_DOWNLINK_MULTIPLES,
    SPARSE_SIZES,
    allreduce_times,
    sharded_topk_times,
    sparse_times,
)
from hvdx.mpi.calibration_pairs import oneway_sets, pair_sets, shift_sets
from hvdx.mpi.calibration_set_averages import SET_ALLREDUCE_SIZES, with_set_averages
from hvdx.mpi.calibration_timing import say_points, timed_points
from hvdx.mpi.topology import host_labels, rack_labels

__all__ = ["DEFAULT_SIZES", "calibrate", "main"]

#: Bytes per flow of the measured rounds: from a latency-bound message to a model.
DEFAULT_SIZES = (1024, 16 * 1024, 128 * 1024, 1 << 20, 4 << 20, 8 << 20)
_TAG = 7401


def calibrate(comm: Optional[MPI.Comm] = None, sizes: Sequence[int] = DEFAULT_SIZES,
              repeats: int = 3, max_round_s: float = 1.0,
              say: Optional[Callable[[str], None]] = None) -> Calibration:
    """Module steps 1-8 (collective): the same calibration on every rank.

    Args:
        comm: the ranks (default ``MPI.COMM_WORLD``).
        sizes: bytes per flow, increasing.
        repeats: timed batches per size (after one warm-up exchange).
        max_round_s: a size whose round took longer is the last one measured, once
            the sizes have reached 4 MiB.
        say: progress lines (rank 0's only are meaningful).

    Raises:
        ValueError: on every rank, if ``comm`` has one rank (no link to time).
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    if comm.Get_size() < 2:
        raise ValueError(f"comm has {comm.Get_size()} rank: calibrating needs at least 2 "
                         "ranks, one per host or as many as training uses")
    hosts = host_labels(comm)
    racks = rack_labels(comm) or ["one rack"] * comm.Get_size()
    rank = comm.Get_rank()
    tables: Dict[str, Dict[int, List[Tuple[float, float]]]] = {}
    sets = pair_sets(hosts, racks)
    biggest = np.zeros(max(sizes), dtype=np.uint8)
    inbox = np.empty_like(biggest)

    # Every round is non-blocking and waited for as hvdx's own exchanges wait
    # (hvdx.mpi.sparse.wait_all: yields, then sleeps), which are what these tables price.
    # A blocking Sendrecv spins: four ranks spinning on two cores starve the kernel's
    # TCP processing, and a swap of 128 KiB across a 100 Mbit NIC read 27 ms where one
    # way took 13.
    def exchange(successor: Optional[int], predecessor: Optional[int]):
        def round_of(nbytes: int) -> Callable[[], None]:
            def one_round() -> None:
                requests = []
                if predecessor is not None:
                    requests.append(comm.Irecv(inbox[:nbytes], source=predecessor, tag=_TAG))
                if successor is not None:
                    requests.append(comm.Isend(biggest[:nbytes], dest=successor, tag=_TAG))
                sparse.wait_all(requests)
            return one_round
        if successor is None and predecessor is None:
            return lambda nbytes: lambda: None
        return round_of

    def swap(partner: Optional[int]) -> Callable[[int], Callable[[], None]]:
        return exchange(partner, partner)

    shift = exchange  # sends to the successor, receives from the predecessor

    def send(successor: Optional[int], predecessor: Optional[int]):
        # One way: the first rank of a pair sends, the second receives.
        return exchange(successor, None) if successor is not None else \
            exchange(None, predecessor)

    for link, flows, pairs in sets:
        partner = next((b if a == rank else a for a, b in pairs if rank in (a, b)), None)
        points = timed_points(comm, sizes, repeats, max_round_s, swap(partner))
        tables.setdefault(link, {})[flows] = points
        say_points(say, rank, f"{link}, {flows} flow(s) per link", points)
    def directed(edge_sets, round_of, what: str) -> Dict[str, Dict[int, List[Tuple[float, float]]]]:
        # Steps 4 and 5: each rank sends to its successor, receives from its predecessor.
        measured: Dict[str, Dict[int, List[Tuple[float, float]]]] = {}
        for link, flows, edges in edge_sets:
            successor = next((b for a, b in edges if a == rank), None)
            predecessor = next((a for a, b in edges if b == rank), None)
            points = timed_points(comm, sizes, repeats, max_round_s,
                                  round_of(successor, predecessor))
            measured.setdefault(link, {})[flows] = points
            say_points(say, rank, what.format(link=link, flows=flows), points)
        return measured

    shifts = directed(shift_sets(hosts, racks), shift,
                      "shifts on {link}, {flows} flow(s) per link each way")
    oneway = directed(oneway_sets(hosts, racks), send,
                      "one way on {link}, {flows} flow(s) per link")
    times = allreduce_times(comm, hosts, racks, repeats, max_round_s, say)
    allgather, alltoall, sharded = sparse_times(comm, repeats, max_round_s, say)
    library = MPI.Get_library_version().strip().splitlines()[0]
    allreduce = "recursive_halving" if "MPICH" in library.upper() else "ring"
    source = (f"{comm.Get_size()} ranks on {len(set(hosts))} hosts in "
              f"{len(set(racks))} rack(s); {library}")
    return Calibration(tables=tables, allreduce=allreduce, source=source,
                       shift_tables=shifts, oneway_tables=oneway, allreduce_times=times,
                       allgather_times=allgather, alltoall_times=alltoall,
                       sharded_topk_times=sharded)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m hvdx.mpi.calibrate --out FILE``: calibrate and write FILE (rank 0).

    With ``--set-averages-of CALIBRATION``, only step 9 runs again, and FILE is that
    calibration with the new times (``hvdx bench`` times them again around DS-Sync's
    run: on shared cores they drift with the machine, 61-189 ms for the same average
    within minutes). ``--set-average-bytes`` adds a size to step 9's, so that the
    model's own is timed rather than interpolated between two others.

    With ``--sharded-topk-of CALIBRATION``, only sharded TopK's step (the end of step
    7) runs again, at the sizes of ``--sharded-topk-bytes`` and the multiples of
    ``--downlink-multiple``, and FILE is that calibration with those times in place of
    its own (``hvdx bench`` times it around each TopK run, at the strategy's size: the
    same step read 154 and 213 ms in two calibrations of one cluster)."""
    parser = argparse.ArgumentParser(prog="python -m hvdx.mpi.calibrate")
    parser.add_argument("--out", required=True, help="calibration file to write")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per size")
    again = parser.add_mutually_exclusive_group()
    again.add_argument("--set-averages-of", metavar="CALIBRATION",
                       help="time only Horovod's averages on process sets again (step 9) "
                       "and write CALIBRATION with the new times to --out")
    again.add_argument("--local-set-averages-of", metavar="CALIBRATION",
                       help="with every rank on this host, standing in for the cluster "
                       "of --racks: time Horovod's averages (step 9) at the sizes "
                       "CALIBRATION timed them and write CALIBRATION with these as its "
                       "local times to --out")
    again.add_argument("--sharded-topk-of", metavar="CALIBRATION",
                       help="time only sharded TopK's step again (end of step 7) and "
                       "write CALIBRATION with the new times to --out")
    parser.add_argument("--set-average-bytes", type=int, action="append", default=[],
                        metavar="BYTES", help="time Horovod's averages (step 9) at this "
                        "size too, such as the model's, however long it takes; repeatable")
    parser.add_argument("--racks", metavar="LABELS",
                        help="with --local-set-averages-of: every rank's rack, "
                        "comma-separated in rank order, e.g. 0,0,1,1")
    parser.add_argument("--sharded-topk-bytes", type=int, action="append", default=[],
                        metavar="BYTES", help="with --sharded-topk-of: uplink bytes per "
                        "rank to time sharded TopK's step at (default: "
                        f"{', '.join(map(str, SPARSE_SIZES))}); repeatable")
    parser.add_argument("--downlink-multiple", type=float, action="append", default=[],
                        metavar="M", help="with --sharded-topk-of: how many times as "
                        "dense as the uplink the timed downlink is (default: "
                        f"{', '.join(map(str, SHARDED_DOWNLINK_MULTIPLES))}); repeatable")
    args = parser.parse_args(argv)
    for flag, sizes, least, what in (
            ("--set-average-bytes", args.set_average_bytes, 4, "one float32"),
            ("--sharded-topk-bytes", args.sharded_topk_bytes, 8, "one pair")):
        for nbytes in sizes:
            if nbytes < least:
                parser.error(f"{flag}={nbytes} must be at least {least} ({what})")
    for multiple in args.downlink_multiple:
        if not multiple > 0:
            parser.error(f"--downlink-multiple={multiple:g} must be positive")
    if args.sharded_topk_of is None:
        for flag, given in (("--sharded-topk-bytes", args.sharded_topk_bytes),
                            ("--downlink-multiple", args.downlink_multiple)):
            if given:
                parser.error(f"{flag} needs --sharded-topk-of: it sizes only that timing")
    elif args.set_average_bytes:
        parser.error("--set-average-bytes sizes Horovod's averages (step 9), which "
                     "--sharded-topk-of does not time; give them to separate jobs")
    racks = None
    if args.racks is not None:
        if args.local_set_averages_of is None:
            parser.error("--racks needs --local-set-averages-of: it labels that job's ranks")
        racks = [label.strip() for label in args.racks.split(",")]
        if len(racks) != MPI.COMM_WORLD.Get_size() or not all(racks):
            parser.error(f"--racks={args.racks!r} must give one rack label per rank "
                         f"({MPI.COMM_WORLD.Get_size()}), comma-separated")
    say = lambda s: print(s, flush=True)  # noqa: E731
    if args.local_set_averages_of:
        base = Calibration.load(args.local_set_averages_of)
        sizes = sorted({int(b) for points in base.set_allreduce_times.values()
                        for b, _ in points} | set(args.set_average_bytes)) or \
            sorted(set(SET_ALLREDUCE_SIZES) | set(args.set_average_bytes))
        calibration = with_set_averages(base, say=say, sizes=sizes, through=max(sizes),
                                        racks=racks, local=True)
    elif args.sharded_topk_of:
        base = Calibration.load(args.sharded_topk_of)
        times = sharded_topk_times(
            MPI.COMM_WORLD, sorted(set(args.sharded_topk_bytes)) or SPARSE_SIZES,
            sorted(set(args.downlink_multiple)) or SHARDED_DOWNLINK_MULTIPLES,
            repeats=args.repeats, say=say)
        calibration = dataclasses.replace(base, sharded_topk_times=times)
    else:
        base = Calibration.load(args.set_averages_of) if args.set_averages_of else \
            calibrate(repeats=args.repeats, say=say)
        sizes = sorted(set(SET_ALLREDUCE_SIZES) | set(args.set_average_bytes))
        calibration = with_set_averages(base, say=say, sizes=sizes,
                                        through=max(args.set_average_bytes, default=0))
    if MPI.COMM_WORLD.Get_rank() == 0:
        calibration.save(args.out)
        say(f"written: {args.out}")
    MPI.COMM_WORLD.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
