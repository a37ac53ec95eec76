"""``hvd.join()`` under hvdx: a rank that ran out of data takes part in hvdx's exchanges
until every rank has joined, as Horovod's join does for Horovod's allreduces.

Horovod's ``join`` lets a rank that ran out of data stop early: until every rank has
joined, Horovod answers the other ranks' allreduces for it with zeros (the average still
divides by every rank). hvdx's own collectives are not Horovod's to answer. So:

1. Horovod's join is started without waiting, so that Horovod answers the others'
   allreduces (the tensors TopK leaves dense, the user's own) from now on;
2. while hvdx's TopK optimizers run collectives of their own, this rank takes each
   step of the others with zero gradients, optimizer by optimizer in the order they
   were made (the order a training loop steps them): its residuals, velocities and
   parameters sit the step out, its share of the server side and its step counter go on
   (:meth:`hvdx.strategies.topk.mpi_driver.TopKSynchronizer.joined_step`), so its state stays the
   others' and training may continue after the join;
3. the NaN/Inf agreement that opens every TopK step tells every rank at once when all
   have joined; then every rank waits for Horovod's join and returns its answer, the
   rank that joined last.

The parameter-mixing strategies (DS-Sync, decentralized SGD) average *parameters*: a
joined rank's zeros would shrink every parameter of its group, and its graph neighbours
would wait for it. While one of their optimizers is alive, ``join`` refuses, on the rank
that calls it, with what to do instead; that rank's uncaught error ends the job
(:mod:`hvdx.mpi.abort`) rather than leaving the others waiting. With no hvdx optimizer
alive it is Horovod's ``join``.
"""

from __future__ import annotations

import gc
import itertools
import weakref

import horovod.torch as _hvd
import torch
from horovod.torch import mpi_ops as _mpi_ops

__all__ = ["join", "track"]

#: The hvdx strategy optimizers alive in this process -> (creation number, strategy name).
_live: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_made = itertools.count()


def track(optimizer, strategy) -> None:
    """Remember ``optimizer``, which runs ``strategy``, for :func:`join`."""
    _live[optimizer] = (next(_made), strategy.name)


def join(device=-1) -> int:
    """Horovod's ``join(device)``, with hvdx's TopK optimizers taking part (steps 1-3 of
    the module docstring). Returns the rank that joined last.

    Raises:
        ValueError: a parameter-mixing optimizer is alive (module docstring).
    """
    gc.collect()  # optimizers no longer referenced are not training: forget them first
    live = sorted(list(_live.items()), key=lambda item: item[1][0])
    mixing = sorted({name for o, (_, name) in live if not hasattr(o, "_hvdx_joined_round")})
    if mixing:
        raise ValueError(
            f"hvd.join(): not supported with hvdx's {', '.join(mixing)} strategy: it "
            "averages parameters, and a joined rank would add zeros to its group's "
            "average or leave its neighbours waiting. Give every rank the same number of "
            "steps instead: torch.utils.data.distributed.DistributedSampler(..., "
            "drop_last=True), or stop every rank after the fewest batches any rank has "
            "(hvd.allreduce(torch.tensor(len(loader)), op=hvd.Min)).")
    if not live:
        return _hvd.join(device)
    handle, output = _join_async(device)
    optimizers = [o for o, _ in live]
    while True:
        rounds = [o._hvdx_joined_round() for o in optimizers]
        if all(r is None for r in rounds) or any(rounds):
            break
    _mpi_ops.synchronize(handle)
    return int(output.item())


def _join_async(device):
    """Step 1: Horovod's ``join`` as ``horovod.torch.join`` starts it, without waiting
    for it (``join`` itself blocks until every rank has joined)."""
    output = torch.tensor(-1, dtype=torch.int, device=torch.device("cpu"))
    handle = _mpi_ops.mpi_lib.horovod_torch_join(output, device)
    _mpi_ops._handle_map[handle] = (None, output)
    return handle, output
