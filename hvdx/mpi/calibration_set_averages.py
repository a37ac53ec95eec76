"""The calibration job's timing of Horovod's averages on process sets (step 9): the
average DS-Sync runs, on its groups' sets (:func:`set_allreduce_times`), added to a
calibration where Horovod for PyTorch is installed (:func:`with_set_averages`).

Step numbers are those of :mod:`hvdx.mpi.calibrate`, which runs the job.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from hvdx.core.calibration import Calibration
from hvdx.mpi.calibration_pairs import rack_members
from hvdx.mpi.calibration_timing import ONCE_RUNS, say_points, timed_points
from hvdx.mpi.topology import rack_labels

__all__ = ["SET_ALLREDUCE_SIZES", "WORLD_AVERAGE_MAX_BYTES", "set_allreduce_times",
           "with_set_averages"]

#: Bytes per rank of the timed Horovod averages (step 9): a negotiation's worth,
#: then models around what DS-Sync averages.
SET_ALLREDUCE_SIZES = (1024, 1 << 20, 4 << 20, 8 << 20)
#: Horovod's average on all ranks (step 9) is timed up to this many bytes: below
#: it a step of Horovod's is mostly Horovod's machinery on these cores, which MPI's
#: allreduce (step 6) does not hold (150 KB on the 2x2 cluster: 74 ms through Horovod,
#: 33 ms MPI's plus 14 ms of negotiation); above it the wire, which step 6 prices.
WORLD_AVERAGE_MAX_BYTES = 1 << 20
#: Untimed runs of each named Horovod average before its timed ones (step 9).
_CACHE_WARMUP = 3


def set_allreduce_times(comm: MPI.Comm, racks: Sequence[object], horovod,
                        ones: Callable[[int], object], repeats: int = 3,
                        max_round_s: float = 1.0, sizes: Sequence[int] = SET_ALLREDUCE_SIZES,
                        say: Optional[Callable[[str], None]] = None, through: int = 0
                        ) -> Dict[str, List[Tuple[float, float]]]:
    """Step 9 (collective): ``{group: [(bytes per rank, seconds)]}``.

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
    members = rack_members(racks)
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
        return timed_points(comm, sizes_of, ONCE_RUNS * repeats, max_round_s, round_of,
                            once=True, statistic=np.mean, through=through)

    times = {}
    try:
        times[name] = timed(own, sets.get(own, horovod.global_process_set), sizes)
        say_points(say, rank, f"Horovod's average on {name} process sets ({size} ranks)",
                   times[name])
        if name != "world":
            # Horovod's own allreduce, on the global set with DS-Sync's sets registered
            # as they are in its runs, up to WORLD_AVERAGE_MAX_BYTES: where a step is
            # mostly Horovod's machinery rather than the wire (step 9).
            times["world"] = timed(
                tuple(range(size)), horovod.global_process_set,
                sorted({b for b in sizes if b <= WORLD_AVERAGE_MAX_BYTES} |
                       ({through} if 0 < through <= WORLD_AVERAGE_MAX_BYTES else set())))
            say_points(say, rank, f"Horovod's average on all {size} ranks", times["world"])
    finally:
        for ps in added:
            horovod.remove_process_set(ps)
    return times


def with_set_averages(calibration: Calibration, comm: Optional[MPI.Comm] = None,
                      say: Optional[Callable[[str], None]] = None,
                      sizes: Sequence[int] = SET_ALLREDUCE_SIZES,
                      through: int = 0, racks: Optional[Sequence[object]] = None,
                      local: bool = False) -> Calibration:
    """``calibration`` with step 9 added (for ``sizes``, each up to ``through``
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


