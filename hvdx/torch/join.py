"""``hvd.join()`` under hvdx: Horovod's, unless an hvdx strategy is training.

Horovod's ``join`` lets a rank that ran out of data stop early: until every rank has
joined, Horovod answers the other ranks' allreduces for it with zeros. hvdx's strategies
exchange through hvdx's own MPI collectives and point-to-point messages, which a
joined rank, waiting inside Horovod, never answers (TopK's and the graph's exchanges
would wait forever), or through Horovod's allreduce of *parameters* (DS-Sync's groups),
where a joined rank's zeros would shrink every parameter of its group. So while an hvdx
strategy's optimizer is alive, ``join`` refuses, on the rank that calls it, with what to
do instead; that rank's uncaught error ends the job (:mod:`hvdx.mpi.abort`) rather than
leaving the others waiting. Without one, it is Horovod's ``join``.
"""

from __future__ import annotations

import weakref

import horovod.torch as _hvd

__all__ = ["join", "track"]

#: The hvdx strategy optimizers alive in this process.
_live: "weakref.WeakSet" = weakref.WeakSet()
#: ``id(optimizer)`` -> what the refusal calls its strategy.
_names = {}


def track(optimizer, strategy) -> None:
    """Remember ``optimizer``, which runs ``strategy``, for :func:`join`'s refusal."""
    _live.add(optimizer)
    _names[id(optimizer)] = strategy.name


def join(device=-1) -> int:
    """Horovod's ``join(device)`` (the rank that joined last), when no hvdx strategy's
    optimizer is alive in this process.

    Raises:
        ValueError: an hvdx strategy's optimizer is alive (module docstring).
    """
    live = sorted({_names.get(id(o), type(o).__name__) for o in list(_live)})
    if live:
        raise ValueError(
            f"hvd.join(): not supported with hvdx's {', '.join(live)} strategy: its exchanges "
            "need every rank in every step, and a joined rank takes part in none. Give "
            "every rank the same number of steps instead: "
            "torch.utils.data.distributed.DistributedSampler(..., drop_last=True), or "
            "stop every rank after the fewest batches any rank has "
            "(hvd.allreduce(torch.tensor(len(loader)), op=hvd.Min)).")
    return _hvd.join(device)
