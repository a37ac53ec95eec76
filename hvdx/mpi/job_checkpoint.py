"""One checkpoint file for a whole job: every rank's state, gathered and scattered.

The collective skeleton that both frameworks' helpers share
(:mod:`hvdx.torch.checkpoint`, :mod:`hvdx.tensorflow.checkpoint`); each brings the
state of one rank and how to turn the file's content into bytes and back.

Writing (:func:`gather_to_file`):

1. every rank's state is gathered to rank 0 (mpi4py, pickled);
2. rank 0 serializes ``{"format", "size", "ranks"}`` and writes the bytes atomically
   (:mod:`hvdx.atomic_file`);
3. rank 0's outcome is broadcast: every rank returns, or raises the same ``OSError``.

Reading (:func:`scatter_from_file`):

1. rank 0 reads and deserializes the file and checks its format and number of ranks;
2. its verdict is broadcast: every rank raises the same ``ValueError``, or
3. every rank receives its own state (one scatter).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from hvdx.atomic_file import write_atomically

__all__ = ["gather_to_file", "scatter_from_file"]


def gather_to_file(comm, path, mine: Any, fmt: str,
                   serialize: Callable[[dict], bytes]) -> None:
    """Writing, steps 1-3 of the module docstring (collective)."""
    path = os.fspath(path)
    everyone = comm.gather(mine, root=0)
    error = None
    if comm.Get_rank() == 0:
        try:
            write_atomically(path, serialize(
                {"format": fmt, "size": comm.Get_size(), "ranks": everyone}))
        except Exception as exc:  # whatever: raised here alone, the others would wait
            error = f"save_checkpoint: rank 0 could not write {path!r}: {exc}"
    error = comm.bcast(error, root=0)
    if error is not None:
        raise OSError(error)


def scatter_from_file(comm, path, fmt: str, deserialize: Callable[[bytes], Any]) -> Any:
    """Reading, steps 1-3 of the module docstring (collective): this rank's state."""
    path = os.fspath(path)
    size, rank = comm.Get_size(), comm.Get_rank()
    content, error = None, None
    if rank == 0:
        try:
            with open(path, "rb") as f:
                content = deserialize(f.read())
        except Exception as exc:  # a foreign pickle raises anything (AttributeError, ...)
            error = f"load_checkpoint: cannot read {path!r} on rank 0: {exc}"
        else:
            if not isinstance(content, dict) or content.get("format") != fmt:
                error = (f"load_checkpoint: {path!r} is not a checkpoint written "
                         "by hvdx's save_checkpoint for this framework")
            elif content["size"] != size:
                error = (f"load_checkpoint: {path!r} holds {content['size']} "
                         f"ranks' state and this job has {size} ranks; resume with "
                         f"{content['size']} ranks")
    error = comm.bcast(error, root=0)
    if error is not None:
        raise ValueError(error)
    return comm.scatter(content["ranks"] if rank == 0 else None, root=0)
