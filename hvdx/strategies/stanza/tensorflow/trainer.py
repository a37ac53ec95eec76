"""Stanza for TensorFlow (Keras): conv workers train the feature extractor, FC workers the head.

Stanza (arXiv 1812.10624; the idea: :mod:`hvdx.strategies.stanza.torch.trainer`) in Keras: the ``S``
*conv workers* train only the feature extractor, the ``F`` *FC workers* (the last
``F`` ranks) only the head, whose variables and gradients never travel to a conv
worker. Roles and scaling: :mod:`hvdx.strategies.stanza.core_roles`; messages:
:mod:`hvdx.strategies.stanza.mpi_exchange`; the step's protocol, the same as
:mod:`hvdx.strategies.stanza.torch.trainer`'s:
:mod:`hvdx.strategies.stanza.mpi_step` (this module runs TensorFlow's part of it). One
:meth:`Stanza.step`, called on every rank, eagerly (the exchange is mpi4py, plain Python):

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

import io
import json
from typing import Dict, List, Optional, Sequence, Tuple, Union

import horovod.tensorflow as _hvd
import numpy as np
import tensorflow as tf

from hvdx.strategies.stanza.core_roles import AUTO, CONV, FC, weighted_loss
from hvdx.mpi import communicator_for
from hvdx.strategies.stanza.core_checks import (Samples, check_settings, head_error, layout_error,
                                                micro_batch_bounds)
from hvdx.strategies.stanza.mpi_exchange import StanzaExchange, StanzaStats, role_communicators
from hvdx.strategies.stanza.mpi_gradients import RoleGradientSum
from hvdx.strategies.stanza.mpi_setup import agree_on_arguments, probe_roles
from hvdx.strategies.stanza.mpi_step import StanzaStep

__all__ = ["FORMAT", "Stanza", "StanzaState", "StanzaStats"]

#: The ``format`` entry of a Stanza checkpoint (:class:`StanzaState`).
FORMAT = "hvdx-tf-stanza-1"


class _Part:
    """One role's Keras layers, applied in order: ``[model]`` or a slice of a
    ``Sequential``'s layers (``split=``). Variables in layer order, each once."""

    def __init__(self, layers: Sequence[tf.keras.layers.Layer], name: str):
        self.layers = tuple(layers)
        self.name = name

    def __call__(self, x, training: bool):
        for layer in self.layers:
            x = layer(x, training=training)
        return x

    @property
    def built(self) -> bool:
        return all(layer.built for layer in self.layers)

    @property
    def weights(self) -> List[tf.Variable]:
        return _unique(w for layer in self.layers for w in layer.weights)

    @property
    def trainable_variables(self) -> List[tf.Variable]:
        return _unique(v for layer in self.layers for v in layer.trainable_variables)


class Stanza:
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
        comm = communicator_for(_hvd.global_process_set, _hvd.global_process_set,
                                _hvd.size())
        size, rank = comm.Get_size(), comm.Get_rank()
        if loss_fn is None:
            loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        error: Optional[Exception] = None
        roles, parts = None, None
        auto = isinstance(fc_workers, str) and fc_workers == AUTO
        try:
            # In the order of the arguments: the model, then fc_workers.
            parts = _parts(features, head, split)
            _build(*parts, example)
            _check_training(*parts, optimizer, loss_fn)
            roles = check_settings(size, fc_workers, micro_batches, _is_batch(example),
                                   _what(example), "dataset")
        except (TypeError, ValueError) as exc:
            error = exc
        entries = _entries(*parts) if error is None else []
        agree_on_arguments(comm, [e[:3] for e in entries],
                           [("fc_workers", fc_workers), ("split", split),
                            ("micro_batches", micro_batches)], error,
                           labels=[e[3] for e in entries])
        self._features, self._head = parts
        #: fc_workers="auto": the agreed probe ``{"conv_s", "head_s", "fc_workers"}``.
        self.probe: Optional[Dict[str, object]] = None
        if auto:
            roles, self.probe = probe_roles(
                comm, int(example.shape[0]), _what(example),
                lambda: _probe(self._features, self._head, example))

        self.optimizer, self.loss_fn = optimizer, loss_fn
        self.micro_batches = int(micro_batches)
        self.roles = roles
        self.rank = rank
        self.role = roles.role(rank)
        self.stats = StanzaStats()
        self.steps = 0
        self._model = features if split is not None else None
        self._split = split
        # The features' per-sample input shape, for full_model's copy of a layer built
        # without one on record: the first conv worker's at step 1, else the example's.
        self._example_shape = None if example is None else _per_sample(example)
        world, role_comm = role_communicators(comm, roles)
        self._exchange = StanzaExchange(world, role_comm, roles, self.stats)
        self._protocol = StanzaStep(self._exchange, rank, micro_batches)
        self._adapter = _Adapter(self)
        self._broadcast_initial()
        _build_optimizer(optimizer, self._mine.trainable_variables)
        self._state = StanzaState(self)

    @property
    def _mine(self) -> _Part:
        """This rank's role's part."""
        return self._features if self.role == CONV else self._head

    @property
    def _samples(self) -> Optional[Samples]:
        return self._protocol.samples

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
        self.stats.begin_step()
        if self.role == CONV:
            loss = self._protocol.conv(_micro_batches(x, y, self.micro_batches),
                                       self._adapter, _per_sample(x))
        else:
            loss = self._protocol.fc(self._adapter)
        # Variables without a gradient (step 5: no rank of the role had one) are left
        # out, so that the optimizer does not move them; the same ones on every rank
        # of the role, so its replicas stay equal.
        pairs = [(g, v) for g, v in zip(self._adapter.take_summed(),
                                        self._mine.trainable_variables) if g is not None]
        if pairs:
            self.optimizer.apply_gradients(pairs)
        self.steps += 1
        self.stats.steps += 1
        return loss

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
        integer = isinstance(rank, (int, np.integer)) and not isinstance(rank, bool)
        copy, copy_error = None, None
        if integer and int(rank) == self.rank:
            try:
                copy = self._copy()
            except Exception as exc:  # whatever Keras raises on a model it cannot clone
                copy_error = (f"Stanza.full_model: rank {self.rank} cannot copy the model: "
                              f"{type(exc).__name__}: {exc}")
        target = self._exchange.agree_on_target(rank, copy_error)
        model, (features, head) = copy if copy is not None else (None, (None, None))

        def part(role, mine, theirs):
            return (role, lambda: _load_bytes(theirs.weights, _weights_bytes(mine)),
                    lambda: _weights_bytes(mine), lambda: _weights_size(mine),
                    lambda buffer: _load_bytes(theirs.weights, buffer))

        self._exchange.assemble(target, [part(CONV, self._features, features),
                                         part(FC, self._head, head)])
        return model if self.rank == target else None

    def _copy(self) -> Tuple[tf.keras.Model, Tuple[_Part, _Part]]:
        """A new model like this one and its two parts (weights still to be loaded)."""
        if self._model is not None:
            model = _clone(self._model, self._input_shape)
            features, head = _parts(model, None, self._split)
            return model, (features, head)
        features = _clone(self._features.layers[0], self._input_shape)
        head = _clone(self._head.layers[0], self._samples.activation_shape
                      if self._samples is not None else _output_shape(features))
        return (tf.keras.Sequential([features, head]),
                (_Part([features], "features"), _Part([head], "head")))

    def state(self) -> "StanzaState":
        """This rank's checkpoint state (:class:`StanzaState`): its role's part, the
        optimizer's variables and the step count, with the role layout. Pass it to
        ``hvdx.tensorflow.save_checkpoint(path, stanza=trainer.state())`` and
        ``load_checkpoint`` (collective), or to a ``tf.train.Checkpoint`` that every
        rank restores at the same point: restoring is collective."""
        return self._state

    def _layout_of_rank(self) -> Dict[str, object]:
        return dict(self.roles.layout(), rank=self.rank, role=self.role)

    def _state_payload(self) -> bytes:
        """:class:`StanzaState`'s bytes: a ``.npz`` (no pickle) of a JSON header and
        the raw bytes of the part's weights and the optimizer's variables."""
        module = [v.numpy() for v in self._mine.weights]
        optimizer = [v.numpy() for v in _optimizer_variables(self.optimizer)]
        header = {"format": FORMAT, "layout": self._layout_of_rank(), "step": self.steps,
                  "module": [_describe(a) for a in module],
                  "optimizer": [_describe(a) for a in optimizer]}
        buffer = io.BytesIO()
        np.savez(buffer, header=np.frombuffer(json.dumps(header).encode(), np.uint8),
                 module=_concat_bytes(module), optimizer=_concat_bytes(optimizer))
        return buffer.getvalue()

    def _load_payload(self, payload: bytes) -> None:
        """Restore :meth:`_state_payload` (collective): every rank checks its state
        first, then the ranks agree, then each assigns; nothing is assigned anywhere
        if any rank's state does not fit."""
        expected = self._layout_of_rank()
        module_vars = self._mine.weights
        optimizer_vars = _optimizer_variables(self.optimizer)
        error, parsed = None, None
        try:
            with np.load(io.BytesIO(payload), allow_pickle=False) as data:
                parsed = {name: data[name] for name in ("header", "module", "optimizer")}
            header = json.loads(parsed["header"].tobytes().decode())
        except Exception as exc:  # a foreign or damaged payload
            header = None
            error = (f"Stanza.state: rank {self.rank}'s checkpoint holds no readable Stanza "
                     f"state: {type(exc).__name__}: {exc}")
        if error is None:
            if not isinstance(header, dict) or header.get("format") != FORMAT:
                error = (f"Stanza.state: rank {self.rank}'s checkpoint holds "
                         f"{_what(header)}, not a Stanza state")
            else:
                error = (layout_error("Stanza.state", self.rank, header.get("layout"),
                                      expected)
                         or _mismatch("module", module_vars, header.get("module"), self.rank)
                         or _mismatch("optimizer", optimizer_vars, header.get("optimizer"),
                                      self.rank))
        error = self._exchange.first_error(error)
        if error is not None:
            raise ValueError(error)
        _load_bytes(module_vars, parsed["module"])
        _load_bytes(optimizer_vars, parsed["optimizer"])
        self.steps = int(header["step"])

    # --- internals --------------------------------------------------------------------

    def _broadcast_initial(self) -> None:
        """The conv workers take rank 0's features, the FC workers rank 0's head."""
        parts = {CONV: self._features, FC: self._head}
        self._exchange.share_initial(lambda role: _weights_bytes(parts[role]),
                                     lambda role: _weights_size(parts[role]),
                                     lambda role, buffer: _load_bytes(parts[role].weights, buffer))


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


class _Adapter:
    """TensorFlow's part of a step (:mod:`hvdx.strategies.stanza.mpi_step` calls it): the passes
    forward and backward under ``tf.GradientTape``, the head and its loss, the role's
    sum (step 5). Gradients add up over micro-batches here, since Keras variables
    hold none."""

    def __init__(self, trainer: Stanza):
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
            raise ValueError(f"Stanza.step: rank {self.t.rank} is a conv worker and needs a "
                             f"batch and its labels, got x={_what(x)}, y={_what(y)}")
        with tf.GradientTape() as tape:
            activations = self.t._features(x, training=True)
        if not tf.is_tensor(activations) or activations.shape.rank is None or \
                activations.shape.rank < 1:
            raise ValueError(f"Stanza.step: rank {self.t.rank}'s features returned "
                             f"{_what(activations)}, not a batch of activations")
        labels = np.ascontiguousarray(y.numpy() if tf.is_tensor(y) else np.asarray(y))
        if labels.ndim < 1 or labels.shape[0] != activations.shape[0]:
            raise ValueError(f"Stanza.step: rank {self.t.rank} has {activations.shape[0]} "
                             f"samples of activations but labels of shape {labels.shape}")
        return (tape, activations, labels), Samples(
            tuple(int(d) for d in activations.shape[1:]), _dtype_name(activations.dtype),
            tuple(labels.shape[1:]), labels.dtype.name)

    @staticmethod
    def count(y) -> int:
        return int(y.shape[0]) if hasattr(y, "shape") else len(y)

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
        return _bytes(sent), _bytes(labels), _bytes(gradient), gradient

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
        return _np_dtype(dtype).itemsize

    @staticmethod
    def empty(shape, dtype: str):
        """FC worker: a host array to receive into, and its byte view."""
        array = np.empty(shape, _np_dtype(dtype))
        return array, _bytes(array)

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
                    raise ValueError(f"loss_fn returned {_what(part)}, not a scalar "
                                     "tensor (the mean over the samples)")
                return part, float(part.numpy())

            return weighted_loss(sizes, bounds, global_batch, loss_of,
                                 lambda part, weight: part * tf.constant(weight,
                                                                         dtype=part.dtype))

    def head_error(self, exc: Exception) -> str:
        return _head_error(self.t._head, self.t.rank, *self._fc, exc)

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
        return _bytes(np.ascontiguousarray(upstream.numpy()))

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
            lambda g: (_dtype_name(g.dtype), int(np.prod(g.shape))), pack, unpack)


# --- helpers -----------------------------------------------------------------------------

def _parts(features, head, split) -> Tuple[_Part, _Part]:
    """``(features, head)`` as :class:`_Part` from the two forms of the arguments."""
    layer = tf.keras.layers.Layer
    if split is None:
        if not isinstance(features, layer) or not isinstance(head, layer):
            raise TypeError(f"Stanza: features and head must be Keras models or layers, got "
                            f"features={_what(features)}, head={_what(head)} (or pass one "
                            "tf.keras.Sequential and split=)")
        return _Part([features], "features"), _Part([head], "head")
    if not isinstance(features, tf.keras.Sequential) or head is not None:
        raise TypeError(f"Stanza: split={split!r} takes one tf.keras.Sequential and "
                        f"head=None, got {_what(features)} and head={_what(head)}")
    layers = list(features.layers)
    n = len(layers)
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)) or \
            not 1 <= split < n:
        raise ValueError(f"split={split!r} must be an integer from 1 to {n - 1} for a "
                         f"Sequential of {n} layers")
    return _Part(layers[:int(split)], "features"), _Part(layers[int(split):], "head")


def _build(features: _Part, head: _Part, example) -> None:
    """Create the variables of a model not built yet, with ``example``; with
    ``example`` also check that the head takes the features' output (``training=False``:
    no BatchNorm statistic changes), so that a misfit fails at construction."""
    if features.built and head.built and example is None:
        return
    unbuilt = " and ".join(f"{p.name} ({', '.join(type(l).__name__ for l in p.layers)})"
                           for p in (features, head) if not p.built)
    if example is None:
        raise ValueError(f"Stanza: the {unbuilt} not built: Keras creates variables at "
                         "the first call, and the ranks must agree on them and take rank "
                         "0's before training. Build the model first (call it once on a "
                         "batch, or give its first layer input_shape=), or pass example= "
                         "(a batch of the features' input)")
    try:
        activations = features(example, training=False)
    except Exception as exc:  # whatever Keras raises on an example that does not fit
        raise ValueError(f"Stanza: example= ({_what(example)}) does not go through "
                         f"the features: {type(exc).__name__}: {exc}") from exc
    try:
        head(activations, training=False)
    except Exception as exc:
        shape = tuple(activations.shape) if tf.is_tensor(activations) else _what(activations)
        raise ValueError(f"Stanza: on example= ({_what(example)}), the head cannot take "
                         f"the features' output: activations of shape {shape}"
                         f"{_takes(head)}: {type(exc).__name__}: {exc}") from exc


def _check_training(features: _Part, head: _Part, optimizer, loss_fn) -> None:
    optimizers = (tf.keras.optimizers.Optimizer, tf.keras.optimizers.legacy.Optimizer)
    if not isinstance(optimizer, optimizers):
        raise TypeError(f"Stanza: optimizer must be a Keras optimizer "
                        f"(tf.keras.optimizers.Optimizer), got {_what(optimizer)}")
    if not callable(loss_fn):
        raise TypeError(f"Stanza: loss_fn must be callable, got {_what(loss_fn)}")
    if not head.trainable_variables:
        kinds = ", ".join(type(layer).__name__ for layer in head.layers)
        raise ValueError(f"Stanza: the head ({kinds}) has no trainable variables: the FC "
                         "workers would have nothing to do; move the layers with weights "
                         "that take the features' output into the head")
    shared = {v.ref() for v in features.weights} & {v.ref() for v in head.weights}
    if shared:
        raise ValueError("Stanza: features and head share variables; the two roles train "
                         "them apart, so they cannot be tied")


def _build_optimizer(optimizer, variables: List[tf.Variable]) -> None:
    """Create the optimizer's variables (slots) for this rank's role."""
    if isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer):
        optimizer._create_all_weights(variables)
    else:
        optimizer.build(variables)


def _optimizer_variables(optimizer) -> List[tf.Variable]:
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def _is_batch(example) -> bool:
    return (tf.is_tensor(example) or isinstance(example, np.ndarray)) and \
        len(example.shape) >= 1 and example.shape[0] >= 1


def _finish(tensors) -> None:
    """Wait for ``tensors`` (an accelerator runs eager ops asynchronously)."""
    tf.add_n([tf.reduce_sum(tf.cast(t, tf.float32)) for t in tensors if t is not None]).numpy()


def _probe(features: _Part, head: _Part, example):
    """fc_workers="auto"'s timed runs (:func:`hvdx.strategies.stanza.mpi_setup.probe_roles`):
    features and head forward + backward with ``training=False`` (a tape changes no
    variable, and BatchNorm statistics stay as they are)."""
    batch = int(example.shape[0])
    activations = features(example, training=False)
    conv_vars, head_vars = features.trainable_variables, head.trainable_variables

    def conv():
        with tf.GradientTape() as tape:
            total = tf.reduce_sum(features(example, training=False))
        _finish(tape.gradient(total, conv_vars) + [total])

    def fc(count):
        inputs = tf.gather(activations, tf.range(count) % batch)

        def run():
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                total = tf.reduce_sum(head(inputs, training=False))
            _finish(tape.gradient(total, [inputs] + head_vars))
        return run

    return conv, fc


def _micro_batches(x, y, count: int) -> List[Tuple[object, object]]:
    """``count`` consecutive parts of a conv worker's batch, sizes differing by at most
    one, the larger first (:func:`hvdx.strategies.stanza.core_checks.micro_batch_bounds`; some are
    empty if the batch has fewer samples). Anything that is not two batches of the same
    length (a dict of inputs, say) stays whole, for the first step's check."""
    if count == 1 or x is None or y is None:
        return [(x, y)]
    labels = y if tf.is_tensor(y) else np.asarray(y)
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) < 1 or shape[0] is None or len(labels.shape) < 1 \
            or int(shape[0]) != int(labels.shape[0]):
        return [(x, y)]
    return [(x[lo:hi], labels[lo:hi]) for lo, hi in micro_batch_bounds(int(shape[0]), count)]


def _entries(features: _Part, head: _Part):
    """Fingerprint entries ``(key, dtype, shape, label)``: every variable of both parts,
    in order; positional keys (variable names may differ between ranks)."""
    return [(f"{part.name}[{i}]", _dtype_name(v.dtype) + ("" if v.trainable else " frozen"),
             tuple(v.shape), v.name)
            for part in (features, head) for i, v in enumerate(part.weights)]


def _clone(layer, per_sample: Optional[Sequence[int]]):
    """A new, built copy of a Keras model or layer (weights not copied): built for the
    input shape Keras recorded when the layer was first called, else ``per_sample``."""
    graph = isinstance(layer, tf.keras.Sequential) or getattr(layer, "_is_graph_network", False)
    clone = tf.keras.models.clone_model(layer) if graph else \
        type(layer).from_config(layer.get_config())
    if not clone.built:
        shape = getattr(layer, "_build_input_shape", None)
        if shape is None and per_sample is None:
            raise ValueError(f"{type(layer).__name__} {layer.name!r} was built without an "
                             "input shape on record; take a step first, so that Stanza "
                             "knows the shapes")
        clone.build(shape if shape is not None else (None,) + tuple(per_sample))
    return clone


def _output_shape(model) -> Optional[Tuple[int, ...]]:
    """The per-sample output shape of a built model (``None`` if Keras cannot tell)."""
    try:
        return tuple(model.compute_output_shape(model._build_input_shape))[1:]
    except Exception:  # no input shape on record, or a layer that cannot tell
        return None


def _per_sample(x) -> Optional[Tuple[Optional[int], ...]]:
    """A batch's per-sample shape (``None`` for inputs without one, e.g. a dict)."""
    shape = getattr(x, "shape", None)
    return None if shape is None else tuple(None if d is None else int(d) for d in shape[1:])


def _unique(variables) -> List[tf.Variable]:
    seen, result = set(), []
    for v in variables:
        if v.ref() not in seen:
            seen.add(v.ref())
            result.append(v)
    return result


def _dtype_name(dtype) -> str:
    return tf.as_dtype(dtype).name


def _np_dtype(name: str) -> np.dtype:
    """numpy's dtype for a TensorFlow or numpy dtype name (bfloat16 too)."""
    try:
        return np.dtype(tf.as_dtype(name).as_numpy_dtype)
    except TypeError:  # a numpy dtype TensorFlow has no name for
        return np.dtype(name)


def _bytes(array: np.ndarray) -> np.ndarray:
    """A host, C-contiguous array's bytes as a numpy view (any dtype, bfloat16 too)."""
    return array.reshape(-1).view(np.uint8)


def _concat_bytes(arrays: Sequence[np.ndarray]) -> np.ndarray:
    parts = [_bytes(np.ascontiguousarray(a)) for a in arrays]
    return np.concatenate(parts) if parts else np.empty(0, np.uint8)


def _weights_size(part: _Part) -> int:
    return sum(int(v.shape.num_elements()) * v.dtype.size for v in part.weights)


def _weights_bytes(part: _Part) -> np.ndarray:
    """Every variable of ``part``, trainable or not, back to back, as host bytes."""
    return _concat_bytes([v.numpy() for v in part.weights])


def _load_bytes(variables: Sequence[tf.Variable], buffer: np.ndarray) -> None:
    """Inverse of :func:`_weights_bytes`: ``buffer`` into ``variables`` (a part's
    ``weights``), on their devices."""
    offset = 0
    for v in variables:
        dtype = _np_dtype(v.dtype.name)
        count = int(v.shape.num_elements()) * dtype.itemsize
        # copy(): an aligned array, so that the bytes can be viewed as v's dtype.
        value = buffer[offset:offset + count].copy().view(dtype).reshape(v.shape)
        with tf.device(v.device):
            v.assign(tf.convert_to_tensor(value))
        offset += count
    if offset != buffer.size:
        raise RuntimeError(f"hvdx.Stanza: {buffer.size} bytes of weights for variables of "
                           f"{offset} bytes")


def _describe(array: np.ndarray) -> List[object]:
    return [array.dtype.name, list(array.shape)]


def _mismatch(what: str, variables: Sequence[tf.Variable], saved, rank: int) -> Optional[str]:
    """Why ``saved`` (``[[dtype, shape], ...]``) does not fit ``variables``, or ``None``."""
    mine = [[_np_dtype(v.dtype.name).name, [int(d) for d in v.shape]] for v in variables]
    if not isinstance(saved, list) or len(saved) != len(mine):
        count = len(saved) if isinstance(saved, list) else "no"
        return (f"Stanza.state: rank {rank}'s {what} state holds {count} variables, its "
                f"{what} has {len(mine)}")
    for i, (a, b) in enumerate(zip(saved, mine)):
        if a != b:
            return (f"Stanza.state: rank {rank}'s {what} variable {i} ({variables[i].name}) "
                    f"was saved as {a[0]} {tuple(a[1])}, this trainer's is {b[0]} "
                    f"{tuple(b[1])}")
    return None


def _takes(head: _Part) -> str:
    """What the head's first layer takes, for the first step's message, or ``""``."""
    layer = head.layers[0]
    while True:
        try:
            return f"; the head takes inputs of shape {layer.input_shape}"
        except (AttributeError, RuntimeError):
            pass  # called eagerly only: no symbolic input shape
        if isinstance(layer, tf.keras.Model) and layer.layers:
            layer = layer.layers[0]
            continue
        break
    spec = layer.input_spec
    spec = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
    axes = getattr(spec, "axes", None)
    if not axes:
        return ""
    return (f"; the head's first layer, {type(layer).__name__}, takes inputs with " +
            ", ".join(f"axis {axis} of size {size}" for axis, size in sorted(axes.items())))


def _head_error(head: _Part, rank, inputs, targets, outputs, exc) -> str:
    """The first step's message for a head (or loss) that cannot take the activations
    (:func:`hvdx.strategies.stanza.core_checks.head_error`)."""
    if outputs is not None:
        outputs = tuple(outputs.shape) if tf.is_tensor(outputs) else _what(outputs)
    return head_error(rank, exc, (inputs.shape, _dtype_name(inputs.dtype)),
                      (targets.shape, _dtype_name(targets.dtype)), outputs, _takes(head))


def _what(value) -> str:
    if tf.is_tensor(value):
        return f"a {_dtype_name(value.dtype)} tensor of shape {tuple(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"a {value.dtype.name} array of shape {value.shape}"
    return "None" if value is None else type(value).__name__
