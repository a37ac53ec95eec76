"""A registered compressor (``hvdx.register_compressor``) for TensorFlow: the tape and
the Keras optimizer.

The algorithm is :mod:`hvdx.core.user_compression`, its step across ranks
:class:`hvdx.mpi.user_compression_exchange.UserCompressionSynchronizer`, the same
object the PyTorch optimizer runs. As for TopK (:mod:`hvdx.strategies.topk.tensorflow.adapters`),
hvdx builds Horovod's tape or Keras optimizer and replaces, on that instance only, the
function through which Horovod sends the gradients (``_allreduce_grads``, and the
aggregation helper's with ``backward_passes_per_step > 1``). One call:

1. the gradients in the order of the variables (the order the fingerprint checked); a
   missing gradient is zeros, an ``IndexedSlices`` one is made dense;
2. ONE ``tf.py_function`` (called directly when eager) runs the synchronizer's step on
   numpy copies (float64 stays float64, anything else is float32): error feedback, one
   exchange, the average (``op=Sum``: the sum); the results come back in each
   gradient's shape and dtype;
3. if some rank's gradient was not finite, every rank's gradients come back NaN and no
   residual changes (what a Keras ``LossScaleOptimizer`` expects of Horovod).

State: the residuals and the step counter live in a :class:`CompressionState` (a
``tf.Module``, saved by ``tf.train.Checkpoint``). Keras: ``optimizer.hvdx_compression``
(tracked, so a checkpoint of the optimizer holds it). Tape: one state per list of
variables, :func:`compression_state`::

    state = hvd.compression_state(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=opt, compression=state)
"""

from __future__ import annotations

from typing import List, Optional

import horovod.tensorflow as _hvd
import numpy as np
import tensorflow as tf

from hvdx.compression_registry import UserCompression
from hvdx.mpi import communicator_for
from hvdx.mpi.user_compression_exchange import (UserCompressionStats,
                                                UserCompressionSynchronizer)
from hvdx.tensorflow.allreduce_replacement import compression_entries, eagerly
from hvdx.tensorflow.residual_state import ResidualState, StatesByVariables

__all__ = ["CompressionState", "compression_state", "keras_adapter", "tape_adapter",
           "tape_counters"]


class CompressionState(ResidualState):
    """Residuals and step counter of one registered compressor's run, checkpointable
    (:class:`~hvdx.tensorflow.residual_state.ResidualState`).

    Bound on the first synchronization to the variables and the spec; a checkpoint
    restored before that is applied then. :attr:`stats` counts the bytes of its
    exchanges (``total_sent``, ``total_received``, ``steps``), as ``hvdx_stats`` does in
    PyTorch; it exists before the first step, so the step log can hold it from the start.
    """

    STATS = UserCompressionStats

    def __init__(self, name: str = "hvdx_compression"):
        super().__init__(name=name)
        self._spec: Optional[UserCompression] = None

    def bind(self, names: List[str], spec: UserCompression, comm, sum_op: bool,
             labels: List[str]) -> UserCompressionSynchronizer:
        def make():
            self._spec = spec
            return UserCompressionSynchronizer(names, spec.compressor, comm, sum_op, labels)

        return self._bound(
            make,
            lambda sync: (sync.names, self._spec.describe(), sync.sum_op) ==
            (tuple(names), spec.describe(), sum_op),
            lambda sync: f"these variables are already synchronized with "
                         f"'{self._spec.describe()}'; one list of variables takes one "
                         "compression setting")

    def _empty(self) -> dict:
        return {"step": 0, "rank": None, "residuals": {}}

    def _encode(self, state: dict):
        names = list(state["residuals"])
        header = {"step": state["step"], "rank": state["rank"], "names": names}
        return header, {f"r{i}": state["residuals"][n] for i, n in enumerate(names)}

    def _decode(self, header: dict, arrays) -> dict:
        return {"step": header["step"], "rank": header["rank"],
                "residuals": {n: arrays[f"r{i}"].copy()
                              for i, n in enumerate(header["names"])}}

    def _check_saved(self, state: dict) -> None:
        rank = state["rank"]
        if rank is not None and int(rank) != _hvd.rank() and state["residuals"]:
            raise ValueError(f"this checkpoint holds the compression residuals of rank "
                             f"{int(rank)} and this is rank {_hvd.rank()}: residuals "
                             "belong to the rank that accumulated them; save and load "
                             "one checkpoint per rank")


#: The :class:`CompressionState` of each list of variables that tapes synchronize.
_tape_states = StatesByVariables(CompressionState)


@tf.autograph.experimental.do_not_convert
def compression_state(variables) -> CompressionState:
    """The :class:`CompressionState` that tapes running a registered compressor use for
    ``variables`` (made if missing): pass the same list, in the same order, as the
    ``sources`` of ``tape.gradient``."""
    return _tape_states(variables)


def make_allreduce_grads(spec: UserCompression, op, process_set, state_of):
    """A replacement for Horovod's ``_allreduce_grads(grads, vars, ...)`` (steps 1-3)."""
    sum_op = op == _hvd.Sum

    @tf.autograph.experimental.do_not_convert
    def allreduce_grads(grads, variables, *unused_args, **unused_kwargs):
        structure = grads
        grads, variables = tf.nest.flatten(grads), tf.nest.flatten(variables)
        if not grads or not process_set.included():
            return structure  # outside process_set: own gradients, as Horovod's
        comm = communicator_for(process_set, _hvd.global_process_set, _hvd.size())
        sync = state_of(variables).bind([f"variable[{i}]" for i in range(len(variables))],
                                        spec, comm, sum_op, [v.name for v in variables])
        tensors = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                   for g, v in zip(grads, variables)]

        def step(*values):
            arrays = [v.numpy() for v in values]
            arrays = [a.astype(np.float64 if a.dtype == np.float64 else np.float32,
                               copy=False) for a in arrays]
            results = sync.synchronize(arrays)
            if results is None:
                return [tf.fill(tf.shape(t), tf.constant(np.nan, t.dtype)) for t in values]
            return [tf.cast(tf.constant(r), t.dtype) for r, t in zip(results, values)]

        return tf.nest.pack_sequence_as(structure, eagerly(step, tensors, "hvdx_user_compression"))

    return allreduce_grads


# --- a registered compressor's entries in hvdx.tensorflow.registry (the catalogue names
# them for every registered compressor) ---------------------------------------------------

def _replacement(spec: UserCompression, args, state_of):
    return make_allreduce_grads(spec, args.op, args.process_set, state_of)


#: Horovod's tape or Keras optimizer with the compressor in place of its allreduce (the
#: arguments passed the spec's job checks, :meth:`UserCompression.prepare`); a Keras
#: optimizer's state is ``opt.hvdx_compression`` (tracked)
#: (:func:`hvdx.tensorflow.allreduce_replacement.compression_entries`).
tape_adapter, keras_adapter, tape_counters = compression_entries(
    _replacement, compression_state, CompressionState, "hvdx_compression")
