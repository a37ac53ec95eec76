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
   for the sizes of :data:`ALLREDUCE_SIZES`;
7. hvdx's sparse allgather and alltoall (:func:`hvdx.mpi.sparse.allgatherv_pairs`,
   :func:`~hvdx.mpi.sparse.alltoallv_pairs`, as TopK calls them) on all ranks, timed as
   in step 3 for the sizes of :data:`SPARSE_SIZES` per rank (an alltoall's pieces are
   equal, one per rank); then sharded TopK's step, the alltoall of each of those sizes
   followed by the allgather of a downlink ``m`` times as dense (``m`` in
   :data:`SHARDED_DOWNLINK_MULTIPLES`: ``m / n`` of the size per rank), timed once
   after a barrier rather than back to back, as the step runs it once after compute
   (:func:`_points` with ``once``; the median of ``4 * repeats`` runs, ``12 * repeats``
   up to 128 KiB);
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
   ranks is timed too, the same way, up to :data:`WORLD_AVERAGE_MAX_BYTES`: below it
   Horovod's step is mostly its machinery on these cores rather than the wire. Each
   average is named, as DS-Sync names its own,
   and run three times untimed first, so that the timed runs are answered from Horovod's
   response cache as DS-Sync's are in every step after its first.

Run it as ``mpirun -n N hvdx plan --calibrate FILE``; ``hvdx bench`` runs it on its
emulated cluster before the workloads (``python -m hvdx.mpi.calibrate --out FILE``),
and again around the runs priced by step 9's averages (DS-Sync's) or by the end of step
7 (each sharded TopK's), timing only those (:func:`main`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from hvdx.core.calibration import Calibration
from hvdx.mpi import sparse
from hvdx.mpi.topology import host_labels, rack_labels

__all__ = ["DEFAULT_SIZES", "SET_ALLREDUCE_SIZES", "SHARDED_DOWNLINK_MULTIPLES", "SPARSE_SIZES",
           "calibrate", "oneway_sets", "pair_sets", "set_allreduce_times",
           "sharded_topk_times", "shift_sets", "with_set_averages"]

#: Bytes per flow of the measured rounds: from a latency-bound message to a model.
DEFAULT_SIZES = (1024, 16 * 1024, 128 * 1024, 1 << 20, 4 << 20, 8 << 20)
#: Bytes per rank of the timed allreduces (module step 6).
ALLREDUCE_SIZES = (1024, 64 * 1024, 1 << 20, 4 << 20, 8 << 20)
#: Bytes per rank of the timed sparse collectives (module step 7): TopK's pairs, from a
#: small model's to a 1% selection of 25M parameters at 8 bytes a pair.
SPARSE_SIZES = (1024, 16 * 1024, 128 * 1024, 1 << 20, 2 << 20)
#: Bytes per rank of the timed Horovod averages (module step 9): a negotiation's worth,
#: then models around what DS-Sync averages.
SET_ALLREDUCE_SIZES = (1024, 1 << 20, 4 << 20, 8 << 20)
#: Horovod's average on all ranks (module step 9) is timed up to this many bytes: below
#: it a step of Horovod's is mostly Horovod's machinery on these cores, which MPI's
#: allreduce (step 6) does not hold (150 KB on the 2x2 cluster: 74 ms through Horovod,
#: 33 ms MPI's plus 14 ms of negotiation); above it the wire, which step 6 prices.
WORLD_AVERAGE_MAX_BYTES = 1 << 20
#: How many times as dense as the uplink the timed TopK downlinks are (module step 7):
#: the presets' (``fast``: as dense, ``safe``: twice).
SHARDED_DOWNLINK_MULTIPLES = (1, 2)
#: Runs per ``repeats`` of a collective timed once after a barrier (module steps 7, 9).
_ONCE_RUNS = 4
#: Untimed runs of each named Horovod average before its timed ones (module step 9).
_CACHE_WARMUP = 3
_TAG = 7401

Pairs = List[Tuple[int, int]]


def _one_per_host(ranks: Sequence[int], hosts: Sequence[int]) -> List[int]:
    """``ranks`` ordered so that each host's first rank comes before any host's second."""
    seen: Dict[int, int] = {}
    keyed = []
    for r in ranks:
        keyed.append((seen.get(hosts[r], 0), r))
        seen[hosts[r]] = seen.get(hosts[r], 0) + 1
    return [r for _, r in sorted(keyed)]


def _rack_members(racks: Sequence[object]) -> Dict[object, List[int]]:
    """Each rack label (in the order ranks first name it) -> its ranks, in rank order."""
    members: Dict[object, List[int]] = {}
    for rank, label in enumerate(racks):
        members.setdefault(label, []).append(rank)
    return members


def pair_sets(hosts: Sequence[int], racks: Sequence[object]) -> List[Tuple[str, int, Pairs]]:
    """Module step 2: ``(link class, flows per link, pairs)`` for every measurement.

    Pure: ``hosts[r]`` and ``racks[r]`` are rank ``r``'s host and rack labels.
    """
    members = _rack_members(racks)
    order = list(members)
    sets: List[Tuple[str, int, Pairs]] = []
    if len(order) > 1:
        a = _one_per_host(members[order[0]], hosts)
        b = _one_per_host(members[order[1]], hosts)
        hosts_a = len({hosts[r] for r in a})
        hosts_b = len({hosts[r] for r in b})
        most = min(hosts_a, hosts_b)
        counts = sorted({c for c in (1, 2, 4, 8, 16, most) if c <= most})
        for c in counts:
            sets.append(("uplink", c, list(zip(a[:c], b[:c]))))
    per_host = max(hosts.count(h) for h in set(hosts))
    host_pairs = []  # (ranks of host h0, ranks of host h1): hosts of one rack, paired
    for label in order:
        by_host: Dict[int, List[int]] = {}
        for r in members[label]:
            by_host.setdefault(hosts[r], []).append(r)
        rack_hosts = list(by_host)
        host_pairs += [(by_host[h0], by_host[h1])
                       for h0, h1 in zip(rack_hosts[0::2], rack_hosts[1::2])]
    if host_pairs:
        sets.append(("nic", 1, [(r0[0], r1[0]) for r0, r1 in host_pairs]))
        if per_host > 1:
            sets.append(("nic", per_host,
                         [pair for r0, r1 in host_pairs for pair in zip(r0, r1)]))
    same: Pairs = []
    for h in dict.fromkeys(hosts):
        local = [r for r in range(len(hosts)) if hosts[r] == h]
        same += list(zip(local[0::2], local[1::2]))
    if same:
        sets.append(("intra-host", 1, same))
    return sets


#: Exchanges per timed batch: small ones back to back, so that a round's latency is
#: measured rather than a barrier's skew; large ones are long enough on their own.
_BATCH_SMALL, _BATCH_LARGE, _SMALL = 8, 2, 128 * 1024
#: Timed batches of a small size, per ``repeats`` (module step 3).
_SMALL_REPEATS = 3
#: Sizes are measured up to this one however long a round takes, so that the slope the
#: cost model extrapolates to a model's size comes from large messages: at 20 Mbit a
#: swap's slope from 128 KiB to 1 MiB priced a 5 MB exchange 60% too high.
_SLOPE_BYTES = 4 << 20


def shift_sets(hosts: Sequence[int], racks: Sequence[object]) -> List[Tuple[str, int, Pairs]]:
    """Module step 4: ``(link class, flows per link each way, directed edges)``.

    Pure: the uplink's rings go ``a0 -> b0 -> a1 -> b1 -> ... -> a0`` through the first
    ``c`` hosts of the first two racks (``c = 1`` is a swap); the NIC's ring goes through
    each rack's hosts in order, every rack at once (only with three hosts or more in a
    rack: two make a swap, which step 3 timed).
    """
    members = _rack_members(racks)
    order = list(members)
    sets: List[Tuple[str, int, Pairs]] = []
    for link, flows, pairs in pair_sets(hosts, racks):
        if link == "uplink" and flows > 1:
            ring = [r for pair in pairs for r in pair]
            sets.append(("uplink", flows, list(zip(ring, ring[1:] + ring[:1]))))
    edges: Pairs = []
    for label in order:
        firsts = list(dict.fromkeys(hosts[r] for r in members[label]))
        ring = [next(r for r in members[label] if hosts[r] == h) for h in firsts]
        if len(ring) > 2:
            edges += list(zip(ring, ring[1:] + ring[:1]))
    if edges:
        sets.append(("nic", 1, edges))
    return sets


def oneway_sets(hosts: Sequence[int], racks: Sequence[object]) -> List[Tuple[str, int, Pairs]]:
    """Module step 5: ``(link class, flows per link one way, directed edges)``: the
    pairs of :func:`pair_sets` (intra-host's aside), each sending from its first rank to
    its second. Pure."""
    return [s for s in pair_sets(hosts, racks) if s[0] != "intra-host"]


def _batch_s(comm: MPI.Comm, count: int, one_round: Callable[[], None]) -> float:
    """A barrier, then ``count`` rounds back to back (module step 3): the slowest rank's
    seconds per round. The barrier and the reduction of the times wait with sleeps
    (:func:`hvdx.mpi.sparse.wait`), so that a rank outside the round (or done with it)
    leaves the cores to those in it, as a rank waiting in hvdx's own exchanges does:
    spinning in MPI instead, one idle rank of four on two cores doubled a three-rank
    allreduce of 224 KB (70 ms against 34)."""
    sparse.wait(comm.Ibarrier())
    start = time.perf_counter()
    for _ in range(count):
        one_round()
    mine = np.array([(time.perf_counter() - start) / count])
    slowest = np.empty_like(mine)
    sparse.wait(comm.Iallreduce(mine, slowest, op=MPI.MAX))
    return float(slowest[0])


def _points(comm: MPI.Comm, sizes: Sequence[int], repeats: int, max_round_s: float,
            round_of: Callable[[int], Callable[[], None]], once: bool = False,
            statistic: Callable[[List[float]], float] = np.median, through: float = 0
            ) -> List[Tuple[float, float]]:
    """Module step 3 for one pattern: ``[(bytes, seconds per round)]`` for each size,
    ``round_of(nbytes)`` giving one round of it; sizes stop after a round over
    ``max_round_s``, though not before ``through`` bytes. ``statistic`` of the batches
    is kept (the median, or the mean where the times have two modes).

    With ``once``, each batch is one round after a barrier, as a step runs its
    collectives once after compute: back to back, each round's sends queue behind the
    previous round's in the shaped links, and an alltoall of 110 KB a rank through a
    20 Mbit uplink averaged 80 ms where one alone took 55-59."""
    points: List[Tuple[float, float]] = []
    for nbytes in sizes:
        one_round = round_of(nbytes)
        small = nbytes <= _SMALL
        count = 1 if once else _BATCH_SMALL if small else _BATCH_LARGE
        _batch_s(comm, 1, one_round)  # warm-up: connections are set up lazily
        seconds = float(statistic([_batch_s(comm, count, one_round)
                                   for _ in range(repeats * (_SMALL_REPEATS if small
                                                             else 1))]))
        points.append((float(nbytes), seconds))
        if seconds > max_round_s and nbytes >= max(_SLOPE_BYTES, through):
            break
    return points


def _said(say: Optional[Callable[[str], None]], rank: int, what: str,
          points: List[Tuple[float, float]]) -> None:
    if say is not None and rank == 0:
        say(f"calibrated {what}: " + ", ".join(f"{b / 1024:.0f} KiB {s * 1e3:.1f} ms"
                                                for b, s in points))


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
        points = _points(comm, sizes, repeats, max_round_s, swap(partner))
        tables.setdefault(link, {})[flows] = points
        _said(say, rank, f"{link}, {flows} flow(s) per link", points)
    def directed(edge_sets, round_of, what: str) -> Dict[str, Dict[int, List[Tuple[float, float]]]]:
        # Steps 4 and 5: each rank sends to its successor, receives from its predecessor.
        measured: Dict[str, Dict[int, List[Tuple[float, float]]]] = {}
        for link, flows, edges in edge_sets:
            successor = next((b for a, b in edges if a == rank), None)
            predecessor = next((a for a, b in edges if b == rank), None)
            points = _points(comm, sizes, repeats, max_round_s,
                             round_of(successor, predecessor))
            measured.setdefault(link, {})[flows] = points
            _said(say, rank, what.format(link=link, flows=flows), points)
        return measured

    shifts = directed(shift_sets(hosts, racks), shift,
                      "shifts on {link}, {flows} flow(s) per link each way")
    oneway = directed(oneway_sets(hosts, racks), send,
                      "one way on {link}, {flows} flow(s) per link")
    times = _allreduce_times(comm, hosts, racks, repeats, max_round_s, say)
    allgather, alltoall, sharded = _sparse_times(comm, repeats, max_round_s, say)
    library = MPI.Get_library_version().strip().splitlines()[0]
    allreduce = "recursive_halving" if "MPICH" in library.upper() else "ring"
    source = (f"{comm.Get_size()} ranks on {len(set(hosts))} hosts in "
              f"{len(set(racks))} rack(s); {library}")
    return Calibration(tables=tables, allreduce=allreduce, source=source,
                       shift_tables=shifts, oneway_tables=oneway, allreduce_times=times,
                       allgather_times=allgather, alltoall_times=alltoall,
                       sharded_topk_times=sharded)


def _allgather_round(comm: MPI.Comm, nbytes: int) -> Callable[[], None]:
    """One run of hvdx's sparse allgather of ``nbytes`` of pairs per rank."""
    pairs = max(1, nbytes // 8)
    indices, values = np.arange(pairs, dtype=np.int64), np.ones(pairs, np.float32)
    return lambda: sparse.allgatherv_pairs(comm, indices, values)


def _alltoall_round(comm: MPI.Comm, nbytes: int) -> Callable[[], None]:
    """One run of hvdx's sparse alltoall of ``nbytes`` of pairs per rank, in equal pieces."""
    size = comm.Get_size()
    pairs = max(1, nbytes // 8 // size)
    piece = (np.arange(pairs, dtype=np.int64), np.ones(pairs, np.float32))
    return lambda: sparse.alltoallv_pairs(comm, [piece] * size)


def _sparse_times(comm: MPI.Comm, repeats: int, max_round_s: float,
                  say: Optional[Callable[[str], None]]
                  ) -> Tuple[List[Tuple[float, float]], List[Tuple[float, float]],
                             Dict[float, List[Tuple[float, float]]]]:
    """Module step 7: ``[(bytes per rank, seconds)]`` of the allgather, the alltoall,
    and per downlink multiple, of sharded TopK's alltoall then allgather."""
    def timed(name: str, round_of) -> List[Tuple[float, float]]:
        points = _points(comm, SPARSE_SIZES, repeats, max_round_s,
                         lambda nbytes: round_of(comm, nbytes))
        _said(say, comm.Get_rank(), f"hvdx's sparse {name}", points)
        return points

    gathered, scattered = timed("allgather", _allgather_round), \
        timed("alltoall", _alltoall_round)
    return gathered, scattered, sharded_topk_times(comm, repeats=repeats,
                                                   max_round_s=max_round_s, say=say)


def sharded_topk_times(comm: MPI.Comm, sizes: Sequence[int] = SPARSE_SIZES,
                       multiples: Sequence[float] = SHARDED_DOWNLINK_MULTIPLES,
                       repeats: int = 3, max_round_s: float = 1.0,
                       say: Optional[Callable[[str], None]] = None
                       ) -> Dict[float, List[Tuple[float, float]]]:
    """The end of module step 7 (collective): ``{multiple: [(bytes per rank, seconds)]}``
    of sharded TopK's step, the alltoall of each of ``sizes`` then the allgather of a
    downlink ``multiple`` times as dense, once after a barrier (the median of ``4 *
    repeats`` runs). ``hvdx bench`` times it again around each TopK run, at the
    strategy's own size (``--sharded-topk-of``)."""
    size = comm.Get_size()

    def sharded(multiple: float) -> Callable[[int], Callable[[], None]]:
        def round_of(nbytes: int) -> Callable[[], None]:
            up = _alltoall_round(comm, nbytes)
            down = _allgather_round(comm, int(multiple * nbytes) // size)

            def one_step() -> None:
                up()
                down()
            return one_step
        return round_of

    steps = {}
    for multiple in multiples:
        # The median of 4 * repeats single runs: of 3, the 128 KiB point read 141 ms in
        # one calibration and 160 in another on the same 20 Mbit cluster.
        steps[float(multiple)] = _points(comm, sizes, _ONCE_RUNS * repeats, max_round_s,
                                         sharded(multiple), once=True)
        _said(say, comm.Get_rank(), f"sharded TopK's alltoall, then an allgather "
              f"{multiple:g}x as dense", steps[float(multiple)])
    return steps


def _allreduce_times(comm: MPI.Comm, hosts: Sequence[int], racks: Sequence[object],
                     repeats: int, max_round_s: float,
                     say: Optional[Callable[[str], None]]) -> Dict[str, List[Tuple[float, float]]]:
    """Module step 6: ``{group: [(bytes, seconds)]}``."""
    rank = comm.Get_rank()
    order = list(dict.fromkeys(racks))
    mine = racks[rank]
    place = [r for r in range(comm.Get_size()) if racks[r] == mine].index(rank)
    widths = {label: racks.count(label) for label in order}
    groups = [("world", None)]
    if len(order) > 1 and min(widths.values()) > 1:
        groups.append(("rack", order.index(mine)))
    if len(order) > 1 and len(set(widths.values())) == 1:
        groups.append(("cross", place))
    times: Dict[str, List[Tuple[float, float]]] = {}
    def allreduce(sub: MPI.Comm) -> Callable[[int], Callable[[], None]]:
        def round_of(nbytes: int) -> Callable[[], None]:
            send = np.ones(nbytes // 4, dtype=np.float32)
            result = np.empty_like(send)
            return lambda: sub.Allreduce(send, result)
        return round_of

    for name, color in groups:
        sub = comm if color is None else comm.Split(color, rank)
        try:
            times[name] = _points(comm, ALLREDUCE_SIZES, repeats, max_round_s,
                                  allreduce(sub))
        finally:
            if sub is not comm:
                sub.Free()
        _said(say, rank, f"allreduce on {name}", times[name])
    return times


def set_allreduce_times(comm: MPI.Comm, racks: Sequence[object], horovod,
                        ones: Callable[[int], object], repeats: int = 3,
                        max_round_s: float = 1.0, sizes: Sequence[int] = SET_ALLREDUCE_SIZES,
                        say: Optional[Callable[[str], None]] = None, through: int = 0
                        ) -> Dict[str, List[Tuple[float, float]]]:
    """Module step 9 (collective): ``{group: [(bytes per rank, seconds)]}``.

    Args:
        comm: the ranks, the same as Horovod's.
        racks: every rank's rack label, in rank order.
        horovod: the initialised Horovod module (``horovod.torch``); with several
            racks it must accept ``add_process_set`` (``hvd.init(process_sets="dynamic")``).
        ones: ``nbytes -> tensor`` of that many bytes of float32, the framework's.
        through: sizes up to this one are timed however long a round takes (the
            model's own size, which the plan reads rather than extrapolates).

    Sets it had to add are removed again; sets already registered are used as found.
    """
    from hvdx.strategies.dssync.mpi_groups import dynamic_process_sets, registered_sets

    rank, size = comm.Get_rank(), comm.Get_size()
    members = _rack_members(racks)
    widths = {len(m) for m in members.values()}
    if len(members) == 1:
        name, groups = "world", []
    elif min(widths) > 1 and len(widths) == 1:
        name = "rack"
        rows = [tuple(m) for m in members.values()]
        groups = rows + [tuple(col) for col in zip(*rows)]  # the racks, then the crossings
    else:
        return {}  # racks of unequal widths: no group the cost model names
    if groups and not dynamic_process_sets():
        raise ValueError("timing Horovod's averages on process sets needs "
                         "hvd.init(process_sets=\"dynamic\")")
    found = registered_sets(horovod) if groups else {}
    added = [horovod.add_process_set(list(g)) for g in groups if g not in found]
    sets = {**found, **{tuple(ps.ranks): ps for ps in added}}
    own = next((g for g in groups[:len(members)] if rank in g), tuple(range(size)))
    average = getattr(horovod, "grouped_allreduce_", None) or horovod.grouped_allreduce

    def timed(group: Tuple[int, ...], mine, sizes_of: Sequence[int]
              ) -> List[Tuple[float, float]]:
        """The average on this rank's set ``mine`` (``group``'s ranks) at ``sizes_of``."""
        def round_of(nbytes: int) -> Callable[[], None]:
            tensor = ones(nbytes)
            # Named, as DS-Sync names its averages: from its second run on, Horovod's
            # response cache answers a named op, and the cached op has its own time (5
            # MiB on the rack sets of the 2x2 cluster: a steady 121-145 ms in 80 runs,
            # where the unnamed op, negotiated anew each time, took 48-168 ms, 88 on
            # average).
            name = f"hvdx.calibrate.{'-'.join(map(str, group))}.{nbytes}"

            def one_round() -> None:
                average([tensor], op=horovod.Average, name=name, process_set=mine)
            for _ in range(_CACHE_WARMUP):  # the timed runs are answered from the cache
                one_round()
            return one_round

        # Once after a barrier, as DS-Sync averages once after its local step, and the
        # mean of 4 * repeats runs: the times can have two modes (unnamed, 5.5 MB on
        # the rack sets of the 2x2 cluster: 53-165 ms in 24 runs, DS-Sync's steps 170
        # and 270 ms), and the mean step holds both. Back to back, the median of two
        # read 61 ms there.
        return _points(comm, sizes_of, _ONCE_RUNS * repeats, max_round_s, round_of,
                       once=True, statistic=np.mean, through=through)

    times = {}
    try:
        times[name] = timed(own, sets.get(own, horovod.global_process_set), sizes)
        _said(say, rank, f"Horovod's average on {name} process sets ({size} ranks)",
              times[name])
        if name != "world":
            # Horovod's own allreduce, on the global set with DS-Sync's sets registered
            # as they are in its runs, up to WORLD_AVERAGE_MAX_BYTES: where a step is
            # mostly Horovod's machinery rather than the wire (module step 9).
            times["world"] = timed(
                tuple(range(size)), horovod.global_process_set,
                sorted({b for b in sizes if b <= WORLD_AVERAGE_MAX_BYTES} |
                       ({through} if 0 < through <= WORLD_AVERAGE_MAX_BYTES else set())))
            _said(say, rank, f"Horovod's average on all {size} ranks", times["world"])
    finally:
        for ps in added:
            horovod.remove_process_set(ps)
    return times


def with_set_averages(calibration: Calibration, comm: Optional[MPI.Comm] = None,
                      say: Optional[Callable[[str], None]] = None,
                      sizes: Sequence[int] = SET_ALLREDUCE_SIZES,
                      through: int = 0, racks: Optional[Sequence[object]] = None,
                      local: bool = False) -> Calibration:
    """``calibration`` with module step 9 added (for ``sizes``, each up to ``through``
    timed however long it takes: :func:`set_allreduce_times`), where Horovod for
    PyTorch is installed (else as it was, and said): Horovod is initialised for it (with
    dynamic process sets) and shut down again, unless it was running already.

    ``racks``: every rank's rack label (default: the job's own, :mod:`hvdx.mpi.topology`).
    With ``local``, the times go to ``local_set_allreduce_times`` instead: the job ran
    with every rank on one host, standing in for the cluster of ``racks``
    (:class:`~hvdx.core.calibration.Calibration` step 8)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    try:
        import torch
        import horovod.torch as hvd
    except ImportError as error:
        if say is not None and comm.Get_rank() == 0:
            say(f"Horovod's averages on process sets not timed ({error}): DS-Sync is "
                "priced from MPI's allreduce")
        return calibration
    started = not hvd.is_initialized()
    if started:
        hvd.init(comm=comm, process_sets="dynamic")
    try:
        times = set_allreduce_times(
            comm, list(racks) if racks is not None else
            rack_labels(comm) or ["one rack"] * comm.Get_size(), hvd,
            lambda nbytes: torch.ones(max(1, nbytes // 4), dtype=torch.float32),
            sizes=sizes, say=say, through=through)
    finally:
        if started:
            hvd.shutdown()
    if local:
        return dataclasses.replace(calibration, local_set_allreduce_times=times)
    return dataclasses.replace(calibration, set_allreduce_times=times)


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
