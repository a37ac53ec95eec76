"""TensorFlow's part of a Stanza step: the passes forward and backward under ``tf.GradientTape``.

Stanza (Wu, Xu, Li, Xiong, arXiv 1812.10624): the step's protocol, the same in every
framework, is :class:`hvdx.strategies.stanza.mpi_step.StanzaStep`; it calls
:class:`TapePasses` for what touches tensors (steps of
:mod:`hvdx.strategies.stanza.tensorflow.trainer`'s module docstring):

1. conv worker: ``features(x)`` under a tape and the checks of its batch; the
   activations and labels as host arrays; ``tape.gradient(activations, variables,
   output_gradients=gradient)`` (step 4), added up over micro-batches;
2. FC worker: host arrays to receive into; ``head(a)`` and the weighted loss
   (:func:`hvdx.strategies.stanza.core_roles.weighted_loss`) under a tape that watches
   the activations; its gradients, the activation gradient as host bytes;
3. both: the role's sum of this step's gradients in host buffers
   (:class:`hvdx.strategies.stanza.mpi_gradients.RoleGradientSum`), kept for the
   optimizer (:meth:`TapePasses.take_summed`).
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import tensorflow as tf

from hvdx.strategies.stanza.core_checkpoint import as_bytes
from hvdx.strategies.stanza.core_checks import (Samples, activations_error, batch_error,
                                                labels_error, loss_error)
from hvdx.strategies.stanza.core_roles import CONV, weighted_loss
from hvdx.strategies.stanza.mpi_gradients import RoleGradientSum
from hvdx.strategies.stanza.tensorflow.keras_parts import dtype_name, np_dtype, what

__all__ = ["TapePasses"]


class TapePasses:
    """TensorFlow's part of a step (module docstring) for ``trainer``, a
    :class:`hvdx.strategies.stanza.tensorflow.trainer.Stanza`. Gradients add up over
    micro-batches here, since Keras variables hold none."""

    def __init__(self, trainer):
        self.t = trainer
        # Step 5, in host buffers (numpy, one per dtype family) of this role's gradients.
        self._sum = RoleGradientSum(trainer._exchange, "conv_allreduce"
                                    if trainer.role == CONV else "fc_allreduce")
        self._gradients: Optional[List[Optional[tf.Tensor]]] = None  # this step's, so far
        self._summed: List[Optional[tf.Tensor]] = []
        self._fc = None  # the FC worker's inputs, labels and outputs of the part in hand
        self._tape = None

    def take_summed(self) -> List[Optional[tf.Tensor]]:
        """Step 5's result for this step's optimizer (once)."""
        summed, self._summed = self._summed, []
        return summed

    def forward(self, x, y):
        """Conv worker, step 1: ``((tape, activations, labels), samples)``; checks the
        batch."""
        if x is None or y is None:
            raise ValueError(batch_error(self.t.rank, what(x), what(y)))
        with tf.GradientTape() as tape:
            activations = self.t._features(x, training=True)
        if not tf.is_tensor(activations) or activations.shape.rank is None or \
                activations.shape.rank < 1:
            raise ValueError(activations_error(self.t.rank, what(activations)))
        labels = np.ascontiguousarray(y.numpy() if tf.is_tensor(y) else np.asarray(y))
        if labels.ndim < 1 or labels.shape[0] != activations.shape[0]:
            raise ValueError(labels_error(self.t.rank, activations.shape[0], labels.shape))
        return (tape, activations, labels), Samples(
            tuple(int(d) for d in activations.shape[1:]), dtype_name(activations.dtype),
            tuple(labels.shape[1:]), labels.dtype.name)

    def host(self, handle, y, count: int):
        """Conv worker: the host buffers of one micro-batch (an empty one: no
        activations), and the buffer its activation gradient comes back in."""
        if handle is None:
            samples = self.t._samples
            sent = self.empty((count,) + samples.activation_shape, samples.activation_dtype)[0]
            labels = np.ascontiguousarray(np.asarray(y))
        else:
            _, activations, labels = handle
            sent = np.ascontiguousarray(activations.numpy())  # host: MPI's buffers
        gradient = np.empty_like(sent)
        return as_bytes(sent), as_bytes(labels), as_bytes(gradient), gradient

    def backward(self, handle, gradient) -> None:
        """Conv worker, step 4: the features' gradients of one micro-batch, added up."""
        if handle is None:
            return
        tape, activations, _ = handle
        with tf.device(activations.device):
            upstream = tf.convert_to_tensor(gradient)
        self._add(tape.gradient(activations, self.t._features.trainable_variables,
                                output_gradients=upstream))

    @staticmethod
    def itemsize(dtype: str) -> int:
        return np_dtype(dtype).itemsize

    @staticmethod
    def empty(shape, dtype: str):
        """FC worker: a host array to receive into, and its byte view."""
        array = np.empty(shape, np_dtype(dtype))
        return array, as_bytes(array)

    def run_head(self, activations, labels, sizes, bounds, global_batch):
        """FC worker, step 3 on one (micro-)batch, under a tape that watches the
        activations: ``(objective, losses)``."""
        variables = self.t._head.trainable_variables
        with tf.device(variables[0].device):
            inputs = tf.convert_to_tensor(activations)
            targets = tf.convert_to_tensor(labels)
        self._fc = [inputs, targets, None]
        self._tape = tf.GradientTape()
        with self._tape as tape:
            tape.watch(inputs)
            outputs = self._fc[2] = self.t._head(inputs, training=True)

            def loss_of(lo, hi):
                part = self.t.loss_fn(targets[lo:hi], outputs[lo:hi])
                if not tf.is_tensor(part) or part.shape.rank != 0:
                    raise ValueError(loss_error(what(part)))
                return part, float(part.numpy())

            return weighted_loss(sizes, bounds, global_batch, loss_of,
                                 lambda part, weight: part * tf.constant(weight,
                                                                         dtype=part.dtype))

    def head_error(self, exc: Exception) -> str:
        return self.t._head_error(*self._fc, exc)

    def head_backward(self, objective) -> np.ndarray:
        """FC worker: the head's gradients added up; the activation gradient's bytes."""
        inputs = self._fc[0]
        variables = self.t._head.trainable_variables
        if objective is not None:
            gradients = self._tape.gradient(objective, [inputs] + variables)
        else:
            gradients = [None] * (1 + len(variables))
        self._tape = None
        self._add(gradients[1:])
        upstream = gradients[0] if gradients[0] is not None else tf.zeros_like(inputs)
        return as_bytes(np.ascontiguousarray(upstream.numpy()))

    def _add(self, gradients) -> None:
        """This step's gradients plus one micro-batch's (``None``: none yet)."""
        if self._gradients is None:
            self._gradients = list(gradients)
            return
        self._gradients = [a if b is None else b if a is None else
                           tf.convert_to_tensor(a) + tf.convert_to_tensor(b)
                           for a, b in zip(self._gradients, gradients)]

    def sum_gradients(self) -> None:
        """Step 5 (:class:`~hvdx.strategies.stanza.mpi_gradients.RoleGradientSum`): the role's
        sums, ``None`` where no rank had a gradient, for :meth:`take_summed`."""
        variables = self.t._mine.trainable_variables
        gradients = self._gradients or [None] * len(variables)
        self._gradients = None
        gradients = [None if g is None else tf.convert_to_tensor(g) for g in gradients]
        arrays: List[np.ndarray] = []

        def pack(layout, buffers, filled):
            arrays[:] = [g if isinstance(g, np.ndarray) else g.numpy() for g in filled]
            layout.pack(arrays, out=buffers)

        def unpack(layout, buffers, filled):
            summed = []
            for v, value in zip(variables, layout.unpack(buffers, arrays)):
                with tf.device(v.device):
                    summed.append(tf.convert_to_tensor(value))
            return summed

        self._summed = self._sum(
            gradients, lambda i: np.zeros(variables[i].shape, variables[i].dtype.as_numpy_dtype),
            lambda g: (dtype_name(g.dtype), int(np.prod(g.shape))), pack, unpack)
