"""Horovod's own allreduce on rack process sets, timed for the calibration.

Step 8 of :mod:`hvdx.core.calibration`: DS-Sync averages inside each rack through
Horovod's process sets, and Horovod's allreduce there costs more than the MPI allreduce
the calibration times on the same ranks (its background cycle, the negotiation inside
the set, the set table agreed every cycle with dynamic sets, its fusion copies).
Horovod has no numpy frontend, so this is timed through ``horovod.torch``, on CPU
tensors as the calibration's own rounds are. Collective over ``comm``:

1. if Horovod is not running yet, ``hvd.init(process_sets="dynamic")`` (DS-Sync's mode,
   and the one that lets sets be added here); if it runs without dynamic sets, nothing
   is timed;
2. one process set per rack, only with two racks or more, each of two ranks or more:
   a set Horovod already holds for those ranks, else one added (every rank in the same
   order);
3. for each size of :data:`~hvdx.mpi.calibrate.ALLREDUCE_SIZES`, every rack at once
   averages one float32 tensor of that many bytes with ``hvd.grouped_allreduce_`` on
   its set, timed as the calibration times its rounds
   (:func:`hvdx.mpi.calibrate.timed_points`);
4. the sets step 2 added are removed, and Horovod shut down if step 1 started it.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import horovod.torch as _hvd
import torch
from mpi4py import MPI

from hvdx.mpi.calibrate import ALLREDUCE_SIZES, timed_points
from hvdx.mpi.dssync_groups import dynamic_process_sets, registered_sets

__all__ = ["horovod_allreduce_times"]


def horovod_allreduce_times(comm: MPI.Comm, racks: Sequence[object], repeats: int,
                            max_round_s: float,
                            say: Optional[Callable[[str], None]] = None,
                            sizes: Sequence[int] = ALLREDUCE_SIZES
                            ) -> Dict[str, List[Tuple[float, float]]]:
    """Module steps 1-4: ``{"rack": [(bytes per rank, seconds)]}``, or ``{}`` where
    there is nothing to time (one rack, a rack of one rank, static process sets).

    ``racks[r]`` is rank ``r``'s rack label; ``comm`` holds the same ranks as
    Horovod's global set, in the same order.
    """
    order = list(dict.fromkeys(racks))
    members = [[r for r in range(len(racks)) if racks[r] == label] for label in order]
    if len(members) < 2 or min(len(m) for m in members) < 2:
        return {}
    started = not _hvd.is_initialized()
    if started:
        _hvd.init(process_sets="dynamic")
    elif not dynamic_process_sets():  # static sets: none can be added now
        return {}
    rank = comm.Get_rank()
    registered = registered_sets(_hvd)
    sets, added = [], []
    for m in members:
        process_set = registered.get(tuple(m))
        if process_set is None:
            process_set = _hvd.add_process_set(m)
            added.append(process_set)
        sets.append(process_set)
    mine = next(s for s, m in zip(sets, members) if rank in m)

    def round_of(nbytes: int) -> Callable[[], None]:
        tensor = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
        name = f"hvdx.calibrate.rack.{nbytes}"
        return lambda: _hvd.grouped_allreduce_([tensor], op=_hvd.Average,
                                               process_set=mine, name=name)

    try:
        points = timed_points(comm, sizes, repeats, max_round_s, round_of)
    finally:
        for process_set in added:
            _hvd.remove_process_set(process_set)
        if started:
            _hvd.shutdown()
    if say is not None and rank == 0:
        say("calibrated Horovod's allreduce on rack: " + ", ".join(
            f"{b / 1024:.0f} KiB {s * 1e3:.1f} ms" for b, s in points))
    return {"rack": points}
