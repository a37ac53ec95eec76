"""Checkpoints of a whole job: every rank's state in one file, written atomically.

Under hvdx's strategies the ranks hold different state: TopK's residuals, the
parameters and local momenta of DS-Sync and decentralized SGD, their step counters. The
Horovod habit, rank 0 saves and every rank loads, would give every rank rank 0's.
These two collective helpers keep each rank's own:

``save_checkpoint(path, model, optimizer, **extra)``:

1. every rank takes ``model.state_dict()``, ``optimizer.state_dict()`` (with hvdx's
   entries: residuals, server residuals, velocities, the schedule's and the peers'
   step counters, adapted topologies, autotune's choice) and ``extra``, moved to host
   memory;
2. they are gathered to rank 0, which serializes them with ``torch.save`` and writes
   the bytes atomically (a temporary file, fsync, rename over ``path``): a reader, or a
   run killed mid-write, finds the previous checkpoint or the new one, never a part of
   one; every rank returns, or raises the same error
   (:func:`hvdx.mpi.job_checkpoint.gather_to_file`).

``load_checkpoint(path, model, optimizer)``: rank 0 reads the file and checks it
(format, number of ranks), broadcasts the verdict (every rank raises the same error
on a bad file), then scatters to every rank its own state, which each rank loads
(model, then optimizer) and whose ``extra`` it returns.

Example::

    hvdx.torch.save_checkpoint("ckpt.pt", model, optimizer, epoch=epoch)   # every rank
    extra = hvdx.torch.load_checkpoint("ckpt.pt", model, optimizer)        # every rank

The file lives where rank 0 writes it; loading needs it on rank 0 only.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from typing import Any, Dict

import horovod.torch as _hvd
import torch

from hvdx.mpi.comm import world
from hvdx.mpi.job_checkpoint import gather_to_file, scatter_from_file

__all__ = ["FORMAT", "load_checkpoint", "save_checkpoint"]

#: The ``format`` entry of an hvdx checkpoint file.
FORMAT = "hvdx-checkpoint-1"


def save_checkpoint(path, model, optimizer=None, **extra: Any) -> None:
    """Write every rank's state to ``path`` on rank 0, atomically (collective).

    Args:
        path: the file rank 0 writes (its directory must exist).
        model: a ``torch.nn.Module`` (its ``state_dict()``), or ``None``.
        optimizer: the (hvdx) optimizer, or ``None``.
        **extra: anything picklable, per rank (an epoch, a data loader's position).

    Raises:
        OSError: on every rank, if rank 0 could not write the file.
    """
    state = {"model": None if model is None else _to_host(model.state_dict()),
             "optimizer": None if optimizer is None else _to_host(optimizer.state_dict()),
             "extra": _to_host(extra)}
    gather_to_file(world(_hvd.global_process_set), path, state, FORMAT, _serialize)


def load_checkpoint(path, model, optimizer=None) -> Dict[str, Any]:
    """Load this rank's state from ``path`` (read on rank 0; collective).

    Returns:
        this rank's ``extra`` of :func:`save_checkpoint`.

    Raises:
        ValueError: on every rank, if the file is missing, unreadable, not an hvdx
            checkpoint, or holds another number of ranks; nothing is loaded then.
    """
    mine = scatter_from_file(world(_hvd.global_process_set), path, FORMAT, _deserialize)
    if model is not None and mine["model"] is not None:
        model.load_state_dict(mine["model"])
    if optimizer is not None and mine["optimizer"] is not None:
        optimizer.load_state_dict(mine["optimizer"])
    return mine["extra"]


def _serialize(content) -> bytes:
    buffer = io.BytesIO()
    torch.save(content, buffer)
    return buffer.getvalue()


def _deserialize(data: bytes):
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def _to_host(value):
    """``value`` with every tensor copied to host memory (a CUDA tensor pickled on one
    rank would be unpickled on rank 0's device)."""
    if torch.is_tensor(value):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        converted = {k: _to_host(v) for k, v in value.items()}
        copy = type(value)(converted) if type(value) in (dict, OrderedDict) else converted
        if hasattr(value, "_metadata"):  # a module's state_dict: its layers' versions
            copy._metadata = value._metadata
        return copy
    if isinstance(value, (list, tuple)):
        converted = [_to_host(v) for v in value]
        return type(value)(converted) if not hasattr(value, "_fields") else \
            type(value)(*converted)
    return value
