"""TopK compression with error feedback for TensorFlow: the tape and the Keras optimizer.

Zou, De Sterck & Liu, "Downlink Compression Improves TopK Sparsification", arXiv
2209.15203. The step (NaN/Inf agreement, dense/compressed split, fused exchange,
residuals, counters) is :class:`hvdx.strategies.topk.mpi_driver.TopKSynchronizer`, the same
object the PyTorch optimizer runs; this module only hands it TensorFlow's gradients.

Horovod's ``DistributedGradientTape`` and Keras ``DistributedOptimizer`` funnel the
gradients through one function, ``_allreduce_grads(grads, vars)``, after setting aside
the variables registered as local (``register_local_source``/``register_local_var``);
hvdx builds Horovod's object (the TopK spec is stored only in that function) and
replaces the function, on this instance only, by :func:`make_allreduce_grads`. Keras
with ``backward_passes_per_step > 1``: Horovod's aggregation helper sums the passes and
calls the function it holds every N passes; hvdx replaces it on the helper of this
optimizer too, so TopK compresses the sum. One call:

1. takes the gradients in the order of the variables (the order the fingerprint
   checked); a missing gradient is zeros (another rank may have one), an
   ``IndexedSlices`` gradient is made dense and averaged by Horovod;
2. runs the whole numpy step inside ONE ``tf.py_function`` that takes every gradient
   and returns every update. Eagerly, the same Python function is called directly (no
   py_function), so errors keep their Python type. Inside a ``tf.function`` (and Keras
   ``fit``) the py_function is traced once and runs at every step, so the residuals,
   the step counter and the warm-up decision live in Python, not in the graph;
3. in it: every rank names its first non-finite gradient and the synchronizer combines
   them. If any rank has one, every rank returns NaN for every gradient and nothing
   else happens in that call (no exchange; no residual, step counter or byte counter
   changes): Horovod's allreduce would carry the inf/NaN into every rank's average, and
   a Keras ``LossScaleOptimizer`` (``mixed_float16``) counts on that to skip the step
   and lower its scale on every rank together;
4. the tensors left dense (fewer than ``min_size`` entries, sparse gradients, the
   warm-up steps) go through ONE ``horovod.tensorflow.grouped_allreduce``, run eagerly
   inside the py_function: it is Horovod's own reduction (same op, prescale/postscale,
   process set, tensor fusion), so small tensors get exactly what Horovod would give
   them, and it needs no extra graph branch for the warm-up. With
   ``small_tensors="in_topk_step"`` the small tensors of a compressed step are averaged
   by the synchronizer instead (one MPI allreduce), and Horovod carries nothing then;
5. the others are flattened to float32 numpy and synchronized by TopK (mpi4py
   collectives on hvdx's communicator, which matches Horovod's process set); the
   updates come back in each gradient's shape and dtype.

Why a py_function and not TensorFlow ops: TopK's pairs differ in number on every rank
(Allgatherv/Alltoallv of variable length) and the residuals are Python state shared
with the PyTorch adapter; one py_function per step runs that shared code unchanged, so
TensorFlow's updates are bitwise PyTorch's and the numpy reference's.

State: residuals live in a :class:`TopKState` (a ``tf.Module``), saved by
``tf.train.Checkpoint`` through a ``PythonState`` (raw float32 bytes, so a resumed run
continues bitwise). Keras: the optimizer tracks it as ``optimizer.hvdx_topk``, so a
checkpoint of the model or of the optimizer includes it. Tape: a tape lives one step,
so the state is kept per list of variables; :func:`topk_state` returns it
(``tf.train.Checkpoint(model=model, optimizer=opt, topk=hvd.topk_state(variables))``).

A NaN/Inf gradient on any rank raises nothing: every rank's gradients come back NaN
(step 3), eagerly as inside a ``tf.function`` or ``fit``, and rank 0 reports the first
such step on stderr.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import tensorflow as tf
import horovod.tensorflow as _hvd

from hvdx.mpi import communicator_for
from hvdx.strategies.topk.core_checkpoint import check_saved_rank
from hvdx.strategies.topk.core_counters import TopKStats
from hvdx.strategies.topk.mpi_driver import TopKSynchronizer
from hvdx.strategies.topk.mpi_nonfinite import first_nonfinite
from hvdx.strategies.topk.spec import TopKCompression
from hvdx.tensorflow.allreduce_replacement import compression_entries, eagerly
from hvdx.tensorflow.residual_state import ResidualState, StatesByVariables

__all__ = ["TopKState", "keras_adapter", "make_allreduce_grads", "tape_adapter",
           "tape_counters", "topk_state"]

class TopKState(ResidualState):
    """Residuals, step counter and byte counters of one TopK run, checkpointable
    (:class:`~hvdx.tensorflow.residual_state.ResidualState`).

    It is bound on the first synchronization to the variables' names, the compression
    spec and the communicator; a checkpoint restored before that is applied then.

    Attributes:
        stats: :class:`~hvdx.strategies.topk.core_counters.TopKStats` (bytes per step, like
            ``optimizer.hvdx_stats`` in PyTorch).
        synchronizer: the shared :class:`~hvdx.strategies.topk.mpi_driver.TopKSynchronizer`
            (``None`` before the first step).
    """

    STATS = TopKStats

    def __init__(self, name: str = "hvdx_topk"):
        super().__init__(name=name)

    def bind(self, names: List[str], compression: TopKCompression, comm,
             sum_op: bool, labels: Optional[List[str]] = None) -> TopKSynchronizer:
        """The synchronizer for these variables and settings (made on the first call)."""
        return self._bound(
            lambda: TopKSynchronizer(names, compression, comm, sum_op=sum_op,
                                     labels=labels),
            lambda sync: (sync.names, sync.compression, sync.sum_op) ==
            (tuple(names), compression, sum_op),
            lambda sync: "hvdx TopK: these variables are already synchronized with "
                         f"'{sync.compression.describe()}' (op="
                         f"{'Sum' if sync.sum_op else 'Average'}); one list of variables "
                         "takes one TopK setting")

    def _empty(self) -> dict:
        return {"step": 0, "mode": None, "size": None, "rank": None, "worker": {},
                "server": {}}

    def _encode(self, state: dict):
        # Everything but the residuals is small and JSON (step, layout, selection, ...).
        header = {k: v for k, v in state.items() if k not in ("worker", "server")}
        arrays = {}
        for side in ("worker", "server"):
            header[side] = list(state[side])
            for i, e in enumerate(state[side].values()):
                arrays[f"{side}{i}"] = e
        return header, arrays

    def _decode(self, header: dict, arrays) -> dict:
        state = dict(header)
        for side in ("worker", "server"):
            state[side] = {n: arrays[f"{side}{i}"].copy()
                           for i, n in enumerate(header[side])}
        return state

    def _check_saved(self, state: dict) -> None:
        check_saved_rank(state, _hvd.rank())


#: The :class:`TopKState` of each list of variables that tapes synchronize.
_tape_states = StatesByVariables(TopKState)


@tf.autograph.experimental.do_not_convert
def topk_state(variables) -> TopKState:
    """The :class:`TopKState` that TopK tapes use for ``variables`` (made if missing).

    Pass the same list, in the same order, as the ``sources`` of ``tape.gradient``
    (without the sources registered with ``register_local_source``, which Horovod keeps
    out of the synchronization); call it before training to checkpoint or restore the
    residuals::

        state = hvd.topk_state(model.trainable_variables)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=opt, topk=state)
    """
    return _tape_states(variables)


def _keys(variables) -> List[str]:
    """Residual keys by position, as the fingerprint names them: Keras makes layer names
    unique per process (``dense_1``), so a restored model's variables may be named
    differently from the saved one's while their order is the same."""
    return [f"variable[{i}]" for i in range(len(variables))]


def make_allreduce_grads(compression: TopKCompression, op, gradient_predivide_factor,
                         process_set, state_of):
    """A replacement for Horovod's ``_allreduce_grads(grads, vars, ...)`` (steps 1 to 5).

    Args:
        state_of: ``variables -> TopKState`` (the optimizer's own, or :func:`topk_state`).
    """
    sum_op = op == _hvd.Sum
    prescale = postscale = 1.0
    if op == _hvd.Average and gradient_predivide_factor != 1.0:
        prescale, postscale = 1.0 / gradient_predivide_factor, gradient_predivide_factor

    # Plain Python at trace time: AutoGraph would otherwise try to convert everything it
    # calls (the synchronizer, mpi4py), which costs tens of seconds and changes nothing.
    @tf.autograph.experimental.do_not_convert
    def allreduce_grads(grads, variables, *unused_args, **unused_kwargs):
        structure = grads
        grads, variables = tf.nest.flatten(grads), tf.nest.flatten(variables)
        if len(grads) != len(variables):
            raise ValueError(f"got {len(grads)} gradients for {len(variables)} variables")
        if not grads:
            return structure
        if not process_set.included():
            # Outside process_set a rank keeps its own gradients, as Horovod's
            # allreduce leaves them there.
            return structure
        comm = communicator_for(process_set, _hvd.global_process_set, _hvd.size())
        state = state_of(variables)
        sync = state.bind(_keys(variables), compression, comm, sum_op,
                          labels=[v.name for v in variables])
        force_dense = [i for i, g in enumerate(grads) if isinstance(g, tf.IndexedSlices)]
        tensors = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                   for g, v in zip(grads, variables)]

        def step(*values):
            return _step(sync, values, force_dense, op, prescale, postscale, process_set)

        return tf.nest.pack_sequence_as(structure, eagerly(step, tensors, "hvdx_topk_synchronize"))

    return allreduce_grads


def _step(sync: TopKSynchronizer, tensors, force_dense, op, prescale, postscale,
          process_set):
    """Steps 3 to 5 on eager tensors; returns one tensor per gradient."""
    arrays = [t.numpy() for t in tensors]
    results = list(tensors)

    def start_dense(positions):
        # Horovod's reduction for the small tensors: one fused, synchronous call.
        if positions:
            reduced = _hvd.grouped_allreduce(
                [tensors[p] for p in positions], op=op, prescale_factor=prescale,
                postscale_factor=postscale, process_set=process_set)
            for p, r in zip(positions, reduced):
                results[p] = r
        return None

    def flat(position):
        return arrays[position].reshape(-1).astype(np.float32, copy=False)

    # Once autotune chose dense, Horovod's allreduce alone: no NaN/Inf agreement.
    first_bad = None if sync.overlaps_dense() else first_nonfinite(arrays)
    updates = sync.synchronize(
        [a.size for a in arrays], flat, start_dense, first_bad,
        force_dense=force_dense, itemsizes=[a.dtype.itemsize for a in arrays])
    if updates is None:
        # Some rank's gradients were not finite: every rank's become NaN (every entry,
        # so that clipping cannot make one finite again) and a loss scaler skips.
        return [tf.fill(tf.shape(t), tf.constant(np.nan, t.dtype)) for t in tensors]
    for p, u in updates.items():
        update = tf.constant(u.reshape(arrays[p].shape))
        results[p] = tf.cast(update, tensors[p].dtype) if tensors[p].dtype != tf.float32 \
            else update
    return results


# --- TopK's entries in hvdx.tensorflow.registry (the catalogue names them) ---------------

def _replacement(strategy: TopKCompression, args, state_of):
    return make_allreduce_grads(strategy, args.op, args.gradient_predivide_factor,
                                args.process_set, state_of)


#: Horovod's tape or Keras optimizer with TopK in place of its allreduce (steps 1 to 5;
#: the arguments passed the spec's job checks, :meth:`TopKCompression.prepare`); a Keras
#: optimizer's state is ``opt.hvdx_topk``, its bytes ``opt.hvdx_stats``
#: (:func:`hvdx.tensorflow.allreduce_replacement.compression_entries`).
tape_adapter, keras_adapter, tape_counters = compression_entries(
    _replacement, topk_state, TopKState, "hvdx_topk")
