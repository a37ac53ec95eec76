"""mpi4py communicators that contain exactly the ranks of a Horovod process set.

Horovod keeps its communicators in C++. hvdx needs its own (for the consistency check,
point-to-point exchanges and byte counting) with the same members in the same rank
order, so that "rank r" means the same process to Horovod and to hvdx.
"""

from __future__ import annotations

from typing import Dict, Tuple

from mpi4py import MPI

__all__ = ["communicator_for", "world"]

_cache: Dict[Tuple[int, ...], MPI.Comm] = {}


def world(global_process_set) -> MPI.Comm:
    """A private duplicate of the communicator Horovod was initialised on."""
    key = ("world",)
    if key not in _cache:
        base = global_process_set.mpi_comm
        if base is None:
            # hvd.init() without a communicator: Horovod uses MPI_COMM_WORLD, or the
            # listed world ranks; hvdx supports the first.
            base = MPI.COMM_WORLD
        _cache[key] = base.Dup()
    return _cache[key]


def communicator_for(process_set, global_process_set, hvd_size: int) -> MPI.Comm:
    """The mpi4py communicator for ``process_set`` (collective over its members).

    Args:
        process_set: a Horovod ``ProcessSet`` (the global one or a registered one).
        global_process_set: Horovod's ``global_process_set``.
        hvd_size: ``hvd.size()``, to check that Horovod runs on the whole communicator.

    Raises:
        RuntimeError: if Horovod was initialised on a subset of ``MPI_COMM_WORLD`` given
            as a rank list, which hvdx cannot reproduce on its side.
    """
    base = world(global_process_set)
    if base.Get_size() != hvd_size:
        raise RuntimeError(
            f"hvdx: Horovod runs {hvd_size} ranks but its communicator has "
            f"{base.Get_size()}; call hvd.init() with no arguments or with comm= an "
            "mpi4py communicator, not with a list of ranks.")
    if process_set is None or process_set is global_process_set or process_set.process_set_id == 0:
        return base
    ranks = tuple(process_set.ranks)
    if ranks not in _cache:
        if process_set.mpi_comm is not None:
            _cache[ranks] = process_set.mpi_comm.Dup()
        else:
            _cache[ranks] = base.Create_group(base.Get_group().Incl(list(ranks)))
    return _cache[ranks]
