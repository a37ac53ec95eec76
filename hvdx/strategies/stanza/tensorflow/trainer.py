"""Stanza for TensorFlow (Keras): conv workers train the feature extractor, FC workers the head.

Stanza (arXiv 1812.10624; the idea: :mod:`hvdx.strategies.stanza.torch.trainer`) in Keras: the ``S``
*conv workers* train only the feature extractor, the ``F`` *FC workers* (the last
``F`` ranks) only the head, whose variables and gradients never travel to a conv
worker. Roles and scaling: :mod:`hvdx.strategies.stanza.core_roles`; messages:
:mod:`hvdx.strategies.stanza.mpi_exchange`; the step's protocol, the same as
:mod:`hvdx.strategies.stanza.torch.trainer`'s: :mod:`hvdx.strategies.stanza.mpi_step`;
the trainer's life (construction, step, whole model):
:mod:`hvdx.strategies.stanza.mpi_trainer`. This module holds TensorFlow's hooks for the
optimizer and the checkpoint; :mod:`hvdx.strategies.stanza.tensorflow.keras_parts` the
Keras parts and their variables, :mod:`hvdx.strategies.stanza.tensorflow.passes` the
passes on tensors. One :meth:`Stanza.step`, called on every rank, eagerly (the exchange
is mpi4py, plain Python):

1. conv worker ``i``: ``a_i = features(x_i)`` on its ``b_i`` samples, under a
   ``tf.GradientTape``; ``a_i`` and the labels go (host memory, ``.numpy()``,
   non-blocking) to its FC worker;
2. FC worker ``k``: receives the activations of the conv workers it serves and
   concatenates them in rank order; the FC workers sum their counts into the global
   batch ``B = sum_i b_i``;
3. FC worker, under a tape that watches the activations:
   ``loss = sum_i (b_i / B) * loss_fn(y_i, head(a)[i])``; its head gradient is
   ``1 / B`` times the sum over its samples, and the activation gradient
   ``dloss / da_i`` already carries ``1 / B``; it returns each conv worker its slice
   (and the mean loss over its samples);
4. conv worker: ``tape.gradient(a_i, features.trainable_variables,
   output_gradients=dloss / da_i)``: ``1 / B`` times the sum over its samples of the
   features' gradients;
5. the conv workers SUM their feature gradients, the FC workers SUM their head
   gradients (one fused host buffer per dtype family, ``MPI_Allreduce`` on a
   communicator per role). Both sums are then the gradient of the mean loss over the
   global batch: averaging instead would give ``1 / S`` (``1 / F``) of it. A variable
   whose gradient is ``None`` on some ranks of the role (a branch not taken) is summed
   as zeros there, as Horovod's allreduce does; one whose gradient is ``None`` on
   EVERY rank of the role stays ``None`` on all of them. The ranks agree on which
   through one presence flag per variable, summed in the same allreduce (no message
   of its own);
6. every rank's optimizer applies its role's gradients (``apply_gradients`` over that
   role's trainable variables only, leaving out those whose gradient is ``None``, so
   that momentum and weight decay leave them as they are, as in single-process
   training). With ``loss_fn`` a mean over samples, the variables equal
   single-process training on the concatenated global batch (up to rounding).

Overlap, as in PyTorch: the FC workers' sum (step 5) runs while the conv workers run
their backward pass (step 4); with ``micro_batches=m > 1`` a conv worker splits its
batch into ``m`` parts, runs every forward pass (a tape each) and sends each part's
activations as soon as they exist, then runs each part's backward pass as its
activation gradient comes back, adding the parts' gradients; the FC worker adds its
head gradients over the parts. The conv workers first send their batch sizes, so that
the weights stay ``b / B``: the step is the same SGD step (up to rounding).

Start: every rank must build the same model (checked, like ``DistributedGradientTape``:
variables in order, shapes and dtypes; TensorFlow's variable names may differ between
ranks and are not compared). Keras creates variables when a model is first called, so
both parts must be built (called once, or given ``input_shape=``), or ``example=``
given to build them. The conv workers then take rank 0's features and the FC workers
rank 0's head (one broadcast each, non-trainable variables such as BatchNorm
statistics included), as ``hvd.broadcast_variables(..., root_rank=0)`` would: the
model trained is rank 0's. Each rank builds its optimizer over its role's trainable
variables at construction, so a checkpoint can be loaded before the first step.

Checks that cannot hang: bad arguments (``fc_workers``, a head with no trainable
variables, a model that is not built, one that differs between ranks) raise the same
``ValueError`` on every rank at construction. The first step checks the data: conv
workers whose activations or labels differ in per-sample shape or dtype, or a head that
cannot take the activations (it runs on the real activations, so no input shape is
needed in advance), raise the same ``ValueError`` on every rank, naming the shapes.
From then on the per-sample shapes are fixed (the batch size may change); a conv worker
that passes another shape raises alone, and ``hvd.init()``'s abort-on-error ends the
job.

What differs from PyTorch: ``loss_fn`` takes Keras' argument order
``loss_fn(labels, head_output)`` (default: sparse categorical cross-entropy on
logits, a mean over samples); the checkpoint is :meth:`Stanza.state`, a trackable for
``hvdx.tensorflow.save_checkpoint`` / ``load_checkpoint`` (below); ``fc_workers="auto"``
times the parts themselves with ``training=False`` (a tape leaves the variables
untouched, so no copies are needed, and BatchNorm statistics stay as they are).

Example::

    model = tf.keras.Sequential([conv_layers..., tf.keras.layers.Flatten(),
                                 tf.keras.layers.Dense(10)])
    model.build((None, 32, 32, 3))
    opt = tf.keras.optimizers.SGD(0.1, momentum=0.9)
    trainer = hvdx.tensorflow.Stanza(model, split=len(model.layers) - 1, optimizer=opt)
    for x, y in dataset:              # shard the data over trainer.roles.conv_ranks
        loss = trainer.step(x, y)     # FC ranks: trainer.step() (x and y unused)
    hvdx.tensorflow.save_checkpoint("ckpt.hvdx", stanza=trainer.state())
    full = trainer.full_model(rank=0) # a tf.keras.Sequential on rank 0, None elsewhere
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple, Union

import horovod.tensorflow as _hvd
import numpy as np
import tensorflow as tf

from hvdx.mpi import communicator_for
from hvdx.strategies.stanza.core_checkpoint import decode_state, encode_state, state_error
from hvdx.strategies.stanza.core_roles import CONV, FC
from hvdx.strategies.stanza.mpi_exchange import StanzaStats
from hvdx.strategies.stanza.mpi_trainer import StanzaTrainer
from hvdx.strategies.stanza.tensorflow.keras_parts import (
    KerasPart, build_parts, check_training, clone, dtype_name, entries, is_batch,
    load_weights, np_dtype, output_shape, parts_of, per_sample, probe_runs, takes,
    weights_bytes, weights_size, what)
from hvdx.strategies.stanza.tensorflow.passes import TapePasses

__all__ = ["FORMAT", "Stanza", "StanzaState", "StanzaStats"]

#: The ``format`` entry of a Stanza checkpoint (:class:`StanzaState`).
FORMAT = "hvdx-tf-stanza-1"


class Stanza(StanzaTrainer):
    """Layer-separated training (module docstring). Collective: build it on every rank.

    Args:
        features: the feature extractor (a Keras model or layer), trained by the conv
            workers; or a ``tf.keras.Sequential`` holding the whole model, with
            ``split=``.
        head: the head (a Keras model or layer), trained by the FC workers; ``None``
            with ``split=``.
        optimizer: a Keras optimizer (``tf.keras.optimizers.Optimizer`` or a legacy
            one), not yet used: each rank builds it over its role's trainable
            variables and applies only their gradients.
        loss_fn: ``loss_fn(labels, head_output)`` (Keras' order): the mean over the
            samples given, which step 3 rescales. Default:
            ``tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)``.
        fc_workers: ``F``, from 1 to ``size // 2``; the last ``F`` ranks. Or ``"auto"``:
            the smallest ``F`` whose FC side keeps up with the conv side
            (:func:`hvdx.strategies.stanza.core_roles.auto_fc_workers`), from a probe at
            construction that times both parts forward and backward on ``example``
            (rank 0 prints the figures and the choice; :attr:`probe`).
        split: with a ``Sequential`` ``features``: its layers ``[:split]`` are the
            features and ``[split:]`` the head (the same layer objects);
            :meth:`full_model` then returns a copy of that model, layer names kept.
        example: a batch of the features' input (the first batch of the dataset does):
            required by ``fc_workers="auto"``, and used to build a model whose
            variables do not exist yet.
        micro_batches: parts each conv worker's batch is split into, so that its
            sends overlap its forward and backward passes (as in
            :mod:`hvdx.strategies.stanza.torch.trainer`); 1 (the default) sends the batch whole. The
            step is the same SGD step, up to rounding.

    Attributes:
        role, roles, stats, probe: as in :class:`hvdx.strategies.stanza.torch.trainer.Stanza`: this
            rank's role (``"conv"`` or ``"fc"``), the
            :class:`~hvdx.strategies.stanza.core_roles.StanzaRoles` (shard the data over
            ``roles.conv_ranks``), the bytes by kind, and with ``fc_workers="auto"``
            the agreed probe (``None`` otherwise).
        steps: steps taken (restored from a checkpoint).

    Raises:
        ValueError: on every rank, for a bad argument or a model that differs between
            ranks; ``TypeError`` for arguments of the wrong type.
    """

    def __init__(self, features, head=None, optimizer=None, loss_fn=None,
                 fc_workers: Union[int, str] = 1, *, split: Optional[int] = None,
                 example=None, micro_batches: int = 1):
        if loss_fn is None:
            loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.optimizer, self.loss_fn = optimizer, loss_fn
        self._model = features if split is not None else None
        self._split = split
        # The features' per-sample input shape, for full_model's copy of a layer built
        # without one on record: the first conv worker's at step 1, else the example's.
        self._example_shape = None if example is None else per_sample(example)
        self._start(communicator_for(_hvd.global_process_set, _hvd.global_process_set,
                                     _hvd.size()),
                    features, head, split, fc_workers, micro_batches, example)
        _build_optimizer(optimizer, self._mine.trainable_variables)
        self._state = StanzaState(self)

    @property
    def _features(self) -> KerasPart:
        return self._parts[CONV]

    @property
    def _head(self) -> KerasPart:
        return self._parts[FC]

    @property
    def _input_shape(self):
        return self._protocol.extra or self._example_shape

    # --- training ---------------------------------------------------------------------

    def step(self, x=None, y=None) -> float:
        """One training step (module docstring, steps 1-6); collective, eager.

        A conv worker passes its batch ``x`` (a tensor on any device, or a numpy array:
        the features' input) and its labels ``y`` (``loss_fn``'s target, one per
        sample); an FC worker passes nothing. Returns the mean loss over the samples
        this rank trained on: a conv worker's own, an FC worker's received ones (with
        one FC worker, the global batch).
        """
        return super().step(x, y)

    # --- the whole model, checkpoints ---------------------------------------------------

    def full_model(self, rank: int = 0) -> Optional[tf.keras.Model]:
        """The complete trained model on ``rank``, ``None`` elsewhere (collective).

        A new model (copies, by ``tf.keras.models.clone_model`` or the layers'
        ``from_config``): ``tf.keras.Sequential([features, head])``, or with ``split=``
        a copy of the original ``Sequential``, layer names kept. The features come from
        rank 0 (every conv worker holds the same), the head from the first FC worker.

        Raises:
            ValueError: on every rank, if ``rank`` is not a rank of the job, the ranks
                asked for different ones, or the model cannot be copied.
        """
        return super().full_model(rank)

    def state(self) -> "StanzaState":
        """This rank's checkpoint state (:class:`StanzaState`): its role's part, the
        optimizer's variables and the step count, with the role layout. Pass it to
        ``hvdx.tensorflow.save_checkpoint(path, stanza=trainer.state())`` and
        ``load_checkpoint`` (collective), or to a ``tf.train.Checkpoint`` that every
        rank restores at the same point: restoring is collective."""
        return self._state

    def _state_payload(self) -> bytes:
        """:class:`StanzaState`'s bytes (:func:`hvdx.strategies.stanza.core_checkpoint.encode_state`):
        the part's weights and the optimizer's variables, with the layout and the step."""
        return encode_state(FORMAT, self._layout_of_rank(), self.steps,
                            [v.numpy() for v in self._mine.weights],
                            [v.numpy() for v in _optimizer_variables(self.optimizer)])

    def _load_payload(self, payload: bytes) -> None:
        """Restore :meth:`_state_payload` (collective): every rank checks its state
        first, then the ranks agree, then each assigns; nothing is assigned anywhere
        if any rank's state does not fit."""
        module_vars = self._mine.weights
        optimizer_vars = _optimizer_variables(self.optimizer)
        header, parsed, error = decode_state(payload, self.rank)
        if error is None:
            error = state_error(header, FORMAT, what(header), self.rank,
                                self._layout_of_rank(),
                                _described(module_vars), [v.name for v in module_vars],
                                _described(optimizer_vars), [v.name for v in optimizer_vars])
        self._agree_on_state(error)
        load_weights(module_vars, parsed["module"])
        load_weights(optimizer_vars, parsed["optimizer"])
        self.steps = int(header["step"])

    # --- hooks of StanzaTrainer ---------------------------------------------------------

    _source = "dataset"

    def _take_parts(self, features, head, split, example):
        parts = parts_of(features, head, split)
        build_parts(*parts, example)
        check_training(*parts, self.optimizer, self.loss_fn)
        return parts

    _entries = staticmethod(entries)

    def _probe(self, example):
        return probe_runs(self._features, self._head, example)

    def _new_adapter(self) -> TapePasses:
        return TapePasses(self)

    _part_bytes = staticmethod(weights_bytes)
    _part_size = staticmethod(weights_size)

    @staticmethod
    def _load_part(part: KerasPart, buffer: np.ndarray) -> None:
        load_weights(part.weights, buffer)

    def _apply_gradients(self) -> None:
        # Variables without a gradient (step 5: no rank of the role had one) are left
        # out, so that the optimizer does not move them; the same ones on every rank
        # of the role, so its replicas stay equal.
        pairs = [(g, v) for g, v in zip(self._adapter.take_summed(),
                                        self._mine.trainable_variables) if g is not None]
        if pairs:
            self.optimizer.apply_gradients(pairs)

    @staticmethod
    def _lengths(x, y):
        """Two batches of the same length split (``y`` as an array unless a tensor);
        anything else (a dict of inputs, say) stays whole."""
        if x is None or y is None:
            return None
        labels = y if tf.is_tensor(y) else np.asarray(y)
        shape = getattr(x, "shape", None)
        if shape is None or len(shape) < 1 or shape[0] is None or len(labels.shape) < 1 \
                or int(shape[0]) != int(labels.shape[0]):
            return None
        return int(shape[0]), x, labels

    _step_extra = staticmethod(per_sample)

    def _model_shell(self) -> Tuple[tf.keras.Model, Dict[str, KerasPart]]:
        """A new model like this one and its two parts (weights still to be loaded)."""
        if self._model is not None:
            model = clone(self._model, self._input_shape)
            features, head = parts_of(model, None, self._split)
            return model, {CONV: features, FC: head}
        features = clone(self._features.layers[0], self._input_shape)
        head = clone(self._head.layers[0], self._samples.activation_shape
                     if self._samples is not None else output_shape(features))
        return (tf.keras.Sequential([features, head]),
                {CONV: KerasPart([features], "features"), FC: KerasPart([head], "head")})

    def _copy_part(self, shell, role: str, buffer: Optional[np.ndarray]) -> None:
        load_weights(shell[1][role].weights,
                     weights_bytes(self._parts[role]) if buffer is None else buffer)

    @staticmethod
    def _whole_model(shell) -> tf.keras.Model:
        return shell[0]

    _is_batch = staticmethod(is_batch)
    _is_tensor = staticmethod(tf.is_tensor)
    _what = staticmethod(what)

    @staticmethod
    def _shape_dtype(tensor):
        return tensor.shape, dtype_name(tensor.dtype)

    _takes = staticmethod(takes)


class StanzaState(tf.Module):
    """A :class:`Stanza`'s checkpoint state on one rank (:meth:`Stanza.state`).

    One tensor, ``state``: this rank's role's weights, its optimizer's variables, the
    step count and the role layout. TensorFlow assigns a checkpoint's variables one
    by one as it reads them, so a checkpoint of separate variables could be half
    loaded before a mismatch showed, and on some ranks only. One tensor reaches the
    trainer whole: every rank checks its layout (world size, ``fc_workers``, rank and
    role) and the shapes and dtypes of what it holds, the ranks agree
    (``hvdx.tensorflow.load_checkpoint`` reads on every rank at once), and only then
    is anything assigned.

    Raises (on restore):
        ValueError: on every rank, nothing loaded, if any rank's checkpoint holds no
            Stanza state, or one saved in another layout or for another model.
    """

    def __init__(self, trainer: Stanza):
        super().__init__(name="hvdx_stanza")
        self._trainer = trainer  # not trackable: the checkpoint holds the one tensor only

    def _serialize_to_tensors(self):
        with tf.device("/cpu:0"):
            return {"state": tf.constant(self._trainer._state_payload())}

    def _restore_from_tensors(self, restored_tensors):
        self._trainer._load_payload(restored_tensors["state"].numpy())
        return None


def _build_optimizer(optimizer, variables: List[tf.Variable]) -> None:
    """Create the optimizer's variables (slots) for this rank's role."""
    if isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer):
        optimizer._create_all_weights(variables)
    else:
        optimizer.build(variables)


def _optimizer_variables(optimizer) -> List[tf.Variable]:
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def _described(variables) -> List[List[object]]:
    """``[[numpy dtype name, shape], ...]`` of ``variables``, as a checkpoint's header
    records them (:func:`hvdx.strategies.stanza.core_checkpoint.describe`)."""
    return [[np_dtype(v.dtype.name).name, [int(d) for d in v.shape]] for v in variables]
