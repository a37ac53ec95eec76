"""Torch tensors into and out of one host buffer per dtype family.

The MPI layer sends numpy buffers from host memory; the fused layout
(:mod:`hvdx.core.fused_layout`) says where each tensor lies in its family's buffer.
These two functions move the tensors, wherever they live, with as few copies as the
device allows. Used by decentralized SGD's neighbour exchange and Stanza's sums.
"""

from __future__ import annotations

from typing import Iterable, Sequence, Tuple

import numpy as np
import torch

__all__ = ["family_dtype", "pack", "unpack"]


def family_dtype(family: np.dtype) -> torch.dtype:
    """The torch dtype of a family's host buffer (float64, else float32)."""
    return torch.float64 if family == np.float64 else torch.float32


def pack(tensors: Sequence[torch.Tensor], send: torch.Tensor) -> None:
    """Copy ``tensors`` back to back into the host buffer ``send`` in one kernel: on the
    host, ``torch.cat`` straight into it; on an accelerator, concatenated there first,
    so that one device-to-host copy moves the family."""
    flat = [t.reshape(-1) for t in tensors]
    device = flat[0].device if flat else send.device
    if device.type == "cpu" and all(t.device == device for t in flat):
        torch.cat([t.to(send.dtype) for t in flat], out=send)
    else:
        send.copy_(torch.cat([t.to(device, send.dtype) for t in flat]))


def unpack(source: torch.Tensor, tensors: Sequence[torch.Tensor],
           slots: Iterable[Tuple[int, int, int]], add: bool = False) -> None:
    """Write (or, with ``add``, add) each ``(index, offset, count)`` slot of the host
    buffer ``source`` into ``tensors[index]``, on its device and in its dtype."""
    with torch.no_grad():
        for i, offset, count in slots:
            value = source[offset:offset + count].view(tensors[i].shape)
            if add:
                tensors[i].add_(value.to(tensors[i].device, tensors[i].dtype))
            else:
                tensors[i].copy_(value)
