"""One checkpoint file for a whole job: every rank's state, gathered and scattered.

The collective skeleton that both frameworks' helpers share
(:mod:`hvdx.torch.checkpoint`, :mod:`hvdx.tensorflow.checkpoint`); each brings the
state of one rank and how to turn the file's content into bytes and back.

Both start with :func:`all_arrive`: the helpers are collective, and Horovod's habit
("save checkpoints only on worker 0", ``if hvd.rank() == 0: save(...)``) would leave
rank 0 waiting forever in the gather for ranks that never come. Every rank that called
instead raises a ``RuntimeError`` saying so within ``HVDX_CHECKPOINT_TIMEOUT`` seconds
(default 30), and an uncaught one ends the job (:mod:`hvdx.mpi.abort`).

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
import time
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from hvdx.atomic_file import write_atomically

__all__ = ["TIMEOUT_VARIABLE", "all_arrive", "gather_to_file", "scatter_from_file"]

#: Seconds the helpers wait for every rank to call them (environment variable).
TIMEOUT_VARIABLE = "HVDX_CHECKPOINT_TIMEOUT"
_DEFAULT_TIMEOUT_S = 30.0
#: The handshake's own tag: hvdx's other point-to-point traffic on the same
#: communicator (graph neighbours, calibration) uses other tags.
_ARRIVE_TAG = 0x4843


def _timeout_s() -> float:
    raw = os.environ.get(TIMEOUT_VARIABLE, "")
    try:
        value = float(raw) if raw.strip() else _DEFAULT_TIMEOUT_S
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{TIMEOUT_VARIABLE}={raw!r} must be a number of seconds > 0")
    return value


def all_arrive(comm, what: str) -> None:
    """Return once every rank of ``comm`` has called ``what`` (collective); raise on
    every rank that called it if some rank did not come in time.

    1. every rank but 0 sends rank 0 a tiny message (MPI delivers it eagerly, so the
       send never waits);
    2. rank 0 waits, polling, until every rank's message came or the timeout passed,
       then sends each rank that came the verdict: the ranks that did not come;
    3. the other ranks wait for that verdict as long (plus a margin, so that rank 0
       decides first);
    4. a missing rank, or no verdict, is a ``RuntimeError`` that says the helper is
       collective and how to call it.

    Raises:
        RuntimeError: see step 4.
        ValueError: ``HVDX_CHECKPOINT_TIMEOUT`` is not a number of seconds > 0.
    """
    timeout = _timeout_s()
    size, rank = comm.Get_size(), comm.Get_rank()
    if size == 1:
        return
    came = np.zeros(size, dtype=bool)
    came[0] = True
    if rank != 0:
        comm.send(what, dest=0, tag=_ARRIVE_TAG)
        deadline = time.monotonic() + timeout + 5.0
        while not comm.Iprobe(source=0, tag=_ARRIVE_TAG):
            if time.monotonic() > deadline:
                raise RuntimeError(_not_all(what, None, timeout))
            time.sleep(0.001)
        missing = comm.recv(source=0, tag=_ARRIVE_TAG)
    else:
        deadline = time.monotonic() + timeout
        while not came.all() and time.monotonic() <= deadline:
            status = MPI.Status()
            if comm.Iprobe(source=MPI.ANY_SOURCE, tag=_ARRIVE_TAG, status=status):
                source = status.Get_source()
                comm.recv(source=source, tag=_ARRIVE_TAG)
                came[source] = True
            else:
                time.sleep(0.001)
        missing = [int(r) for r in np.flatnonzero(~came)]
        for r in np.flatnonzero(came[1:]) + 1:
            comm.send(missing, dest=int(r), tag=_ARRIVE_TAG)
    if missing:
        raise RuntimeError(_not_all(what, missing, timeout))


def _not_all(what: str, missing, timeout: float) -> str:
    who = "rank 0 did not answer" if missing is None else \
        f"rank(s) {missing} did not call it"
    return (f"{what}: {who} within {timeout:g} s. It is collective: every rank keeps "
            f"state of its own under hvdx's strategies, so call {what} on every rank, "
            "not under `if hvd.rank() == 0:` (rank 0 alone writes and reads the file). "
            f"A slow rank needs a longer {TIMEOUT_VARIABLE}.")


def gather_to_file(comm, path, mine: Any, fmt: str,
                   serialize: Callable[[dict], bytes]) -> None:
    """Writing, steps 1-3 of the module docstring (collective)."""
    path = os.fspath(path)
    all_arrive(comm, "save_checkpoint")
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
    all_arrive(comm, "load_checkpoint")
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
