"""PyTorch's part of a Stanza step: the passes forward and backward on tensors.

Stanza (Wu, Xu, Li, Xiong, arXiv 1812.10624): the step's protocol, the same in every
framework, is :class:`hvdx.strategies.stanza.mpi_step.StanzaStep`; it calls
:class:`TorchPasses` for what touches tensors (steps of
:mod:`hvdx.strategies.stanza.torch.trainer`'s module docstring):

1. conv worker: ``features(x)`` and the checks of its batch; the activations and
   labels as host bytes; ``activations.backward(gradient)`` (step 4: the features'
   gradients add up over micro-batches in ``grad``);
2. FC worker: host tensors to receive into; ``head(a)`` and the weighted loss
   (:func:`hvdx.strategies.stanza.core_roles.weighted_loss`), its backward pass, the
   activation gradient as host bytes;
3. both: the role's sum of ``grad`` in host buffers
   (:class:`hvdx.strategies.stanza.mpi_gradients.RoleGradientSum`).

Also the small tensor helpers the trainer shares: :func:`what` (a value in words),
:func:`as_bytes`, :func:`trainable`.
"""

from __future__ import annotations

from typing import List

import numpy as np
import torch
import torch.nn as nn

from hvdx.strategies.stanza.core_checks import (Samples, activations_error, batch_error,
                                                labels_error, loss_error)
from hvdx.strategies.stanza.core_roles import CONV, weighted_loss
from hvdx.strategies.stanza.mpi_gradients import RoleGradientSum
from hvdx.torch.host_buffers import family_dtype, pack, unpack

__all__ = ["TorchPasses", "as_bytes", "trainable", "what"]


class TorchPasses:
    """PyTorch's part of a step (module docstring) for ``trainer``, a
    :class:`hvdx.strategies.stanza.torch.trainer.Stanza`."""

    def __init__(self, trainer):
        self.t = trainer
        # Step 5, in host buffers (one per dtype family) of this role's gradients.
        self._sum = RoleGradientSum(
            trainer._exchange, "conv_allreduce" if trainer.role == CONV else "fc_allreduce",
            lambda family, count: torch.empty(count, dtype=family_dtype(family)),
            lambda buffer: buffer.numpy())
        self._fc = None  # the FC worker's inputs, labels and outputs of the part in hand

    def forward(self, x, y):
        """Conv worker, step 1: ``(activations, samples)``; checks the batch."""
        rank = self.t.rank
        if not torch.is_tensor(x) or not torch.is_tensor(y):
            raise ValueError(batch_error(rank, what(x), what(y)))
        activations = self.t.features(x)
        if not torch.is_tensor(activations) or activations.dim() < 1:
            raise ValueError(activations_error(rank, what(activations)))
        if y.dim() < 1 or y.shape[0] != activations.shape[0]:
            raise ValueError(labels_error(rank, activations.shape[0], tuple(y.shape)))
        return activations, Samples(tuple(activations.shape[1:]), str(activations.dtype),
                                    tuple(y.shape[1:]), str(y.dtype))

    def host(self, activations, y, count: int):
        """Conv worker: the host buffers of one micro-batch (an empty one: no
        activations), and the buffer its activation gradient comes back in."""
        if activations is None:
            samples = self.t._samples
            sent = self.empty((count,) + samples.activation_shape, samples.activation_dtype)[0]
        else:
            sent = activations.detach().to("cpu").contiguous()
        labels = y.detach().to("cpu").contiguous()
        gradient = torch.empty(sent.shape, dtype=sent.dtype)  # host: MPI's buffer
        return as_bytes(sent), as_bytes(labels), as_bytes(gradient), gradient

    @staticmethod
    def backward(activations, gradient) -> None:
        """Conv worker, step 4: the features' gradients add up over micro-batches."""
        if activations is not None and activations.requires_grad:
            activations.backward(gradient.to(activations.device))

    @staticmethod
    def itemsize(dtype: str) -> int:
        return torch.empty(0, dtype=_dtype(dtype)).element_size()

    @staticmethod
    def empty(shape, dtype: str):
        """FC worker: a host tensor to receive into, and its byte view."""
        tensor = torch.empty(shape, dtype=_dtype(dtype))
        return tensor, as_bytes(tensor)

    def run_head(self, activations, labels, sizes, bounds, global_batch):
        """FC worker, step 3 on one (micro-)batch: ``(objective, losses)``."""
        device = next(iter(self.t.head.parameters())).device
        inputs = activations.to(device).requires_grad_(True)
        self._fc = [inputs, labels.to(device), None]
        outputs = self._fc[2] = self.t.head(inputs) if len(inputs) else None

        def loss_of(lo, hi):
            part = self.t.loss_fn(outputs[lo:hi], self._fc[1][lo:hi])
            if not torch.is_tensor(part) or part.dim() != 0:
                raise ValueError(loss_error(what(part)))
            return part, part.item()

        return weighted_loss(sizes, bounds, global_batch, loss_of,
                             lambda part, weight: part * weight)

    def head_error(self, exc: Exception) -> str:
        return self.t._head_error(*self._fc, exc)

    def head_backward(self, objective) -> np.ndarray:
        """FC worker: the head's gradients accumulate; the activation gradient's bytes."""
        inputs = self._fc[0]
        if objective is not None:
            objective.backward()
        gradient = inputs.grad if inputs.grad is not None else torch.zeros_like(inputs)
        return as_bytes(gradient.detach().to("cpu").contiguous())

    def sum_gradients(self) -> None:
        """Step 5 (:class:`~hvdx.strategies.stanza.mpi_gradients.RoleGradientSum`): each
        parameter's ``grad`` is the role's sum, ``None`` where no rank had one."""
        params = trainable(self.t._mine)
        with torch.no_grad():
            summed = self._sum([p.grad for p in params], lambda i: torch.zeros_like(params[i]),
                               lambda g: (str(g.dtype), g.numel()), _pack, _unpack)
            for p, grad in zip(params, summed):
                p.grad = grad


def trainable(module: nn.Module) -> List[torch.Tensor]:
    """The parameters of ``module`` that train."""
    return [p for p in module.parameters() if p.requires_grad]


def as_bytes(tensor: torch.Tensor) -> np.ndarray:
    """A host, C-contiguous tensor's bytes as a numpy view (any dtype, bfloat16 too)."""
    return tensor.reshape(-1).view(torch.uint8).numpy()


def what(value) -> str:
    """A value in words, for messages."""
    if torch.is_tensor(value):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return "None" if value is None else type(value).__name__


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.rsplit(".", 1)[-1])


def _pack(layout, buffers, grads) -> None:
    for family, slots in layout.slots.items():
        pack([grads[s.index] for s in slots], buffers[family][:layout.ends[family]])


def _unpack(layout, buffers, grads) -> List[torch.Tensor]:
    for family, slots in layout.slots.items():
        unpack(buffers[family], grads, slots)
    return grads
