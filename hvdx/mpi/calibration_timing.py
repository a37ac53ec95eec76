"""How the calibration job times one pattern of rounds (step 3): a barrier, then rounds
back to back (or one, after a barrier), timed by the slowest rank, waiting with sleeps
as hvdx's own exchanges wait (:func:`batch_s`); a batch statistic per size, the sizes
stopping once a large round is slow (:func:`timed_points`).

Step numbers are those of :mod:`hvdx.mpi.calibrate`, which runs the job.
"""

from __future__ import annotations

import time
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from hvdx.mpi import sparse

__all__ = ["ONCE_RUNS", "batch_s", "say_points", "timed_points"]

#: Runs per ``repeats`` of a collective timed once after a barrier (steps 7, 9).
ONCE_RUNS = 4

#: Exchanges per timed batch: small ones back to back, so that a round's latency is
#: measured rather than a barrier's skew; large ones are long enough on their own.
_BATCH_SMALL, _BATCH_LARGE, _SMALL = 8, 2, 128 * 1024
#: Timed batches of a small size, per ``repeats`` (step 3).
_SMALL_REPEATS = 3
#: Sizes are measured up to this one however long a round takes, so that the slope the
#: cost model extrapolates to a model's size comes from large messages: at 20 Mbit a
#: swap's slope from 128 KiB to 1 MiB priced a 5 MB exchange 60% too high.
_SLOPE_BYTES = 4 << 20


def batch_s(comm: MPI.Comm, count: int, one_round: Callable[[], None]) -> float:
    """A barrier, then ``count`` rounds back to back (step 3): the slowest rank's
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


def timed_points(comm: MPI.Comm, sizes: Sequence[int], repeats: int, max_round_s: float,
                 round_of: Callable[[int], Callable[[], None]], once: bool = False,
                 statistic: Callable[[List[float]], float] = np.median, through: float = 0
                 ) -> List[Tuple[float, float]]:
    """Step 3 for one pattern: ``[(bytes, seconds per round)]`` for each size,
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
        batch_s(comm, 1, one_round)  # warm-up: connections are set up lazily
        seconds = float(statistic([batch_s(comm, count, one_round)
                                   for _ in range(repeats * (_SMALL_REPEATS if small
                                                             else 1))]))
        points.append((float(nbytes), seconds))
        if seconds > max_round_s and nbytes >= max(_SLOPE_BYTES, through):
            break
    return points


def say_points(say: Optional[Callable[[str], None]], rank: int, what: str,
               points: List[Tuple[float, float]]) -> None:
    """Rank 0 says one size's time after another of ``what``."""
    if say is not None and rank == 0:
        say(f"calibrated {what}: " + ", ".join(f"{b / 1024:.0f} KiB {s * 1e3:.1f} ms"
                                                for b, s in points))


