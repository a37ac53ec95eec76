"""The calibration job's timings of whole collectives on all ranks: the MPI allreduce
on the strategies' groups (step 6, :func:`allreduce_times`), and hvdx's sparse
allgather and alltoall with sharded TopK's step made of them (step 7,
:func:`sparse_times`, :func:`sharded_topk_times`).

Step numbers are those of :mod:`hvdx.mpi.calibrate`, which runs the job.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from hvdx.mpi import sparse
from hvdx.mpi.calibration_timing import ONCE_RUNS, say_points, timed_points

__all__ = ["ALLREDUCE_SIZES", "SHARDED_DOWNLINK_MULTIPLES", "SPARSE_SIZES",
           "allreduce_times", "sharded_topk_times", "sparse_times"]

#: Bytes per rank of the timed allreduces (step 6).
ALLREDUCE_SIZES = (1024, 64 * 1024, 1 << 20, 4 << 20, 8 << 20)
#: Bytes per rank of the timed sparse collectives (step 7): TopK's pairs, from a
#: small model's to a 1% selection of 25M parameters at 8 bytes a pair.
SPARSE_SIZES = (1024, 16 * 1024, 128 * 1024, 1 << 20, 2 << 20)
#: How many times as dense as the uplink the timed TopK downlinks are (step 7):
#: the presets' (``fast``: as dense, ``safe``: twice).
SHARDED_DOWNLINK_MULTIPLES = (1, 2)


def allreduce_times(comm: MPI.Comm, hosts: Sequence[int], racks: Sequence[object],
                    repeats: int, max_round_s: float, say: Optional[Callable[[str], None]]
                    ) -> Dict[str, List[Tuple[float, float]]]:
    """Step 6: ``{group: [(bytes, seconds)]}``."""
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
            times[name] = timed_points(comm, ALLREDUCE_SIZES, repeats, max_round_s,
                                       allreduce(sub))
        finally:
            if sub is not comm:
                sub.Free()
        say_points(say, rank, f"allreduce on {name}", times[name])
    return times


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


def sparse_times(comm: MPI.Comm, repeats: int, max_round_s: float,
                 say: Optional[Callable[[str], None]]
                 ) -> Tuple[List[Tuple[float, float]], List[Tuple[float, float]],
                            Dict[float, List[Tuple[float, float]]]]:
    """Step 7: ``[(bytes per rank, seconds)]`` of the allgather, the alltoall,
    and per downlink multiple, of sharded TopK's alltoall then allgather."""
    def timed(name: str, round_of) -> List[Tuple[float, float]]:
        points = timed_points(comm, SPARSE_SIZES, repeats, max_round_s,
                              lambda nbytes: round_of(comm, nbytes))
        say_points(say, comm.Get_rank(), f"hvdx's sparse {name}", points)
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
    """The end of step 7 (collective): ``{multiple: [(bytes per rank, seconds)]}``
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
        steps[float(multiple)] = timed_points(comm, sizes, ONCE_RUNS * repeats,
                                              max_round_s, sharded(multiple), once=True)
        say_points(say, comm.Get_rank(), f"sharded TopK's alltoall, then an allgather "
                   f"{multiple:g}x as dense", steps[float(multiple)])
    return steps


