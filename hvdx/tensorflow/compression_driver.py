"""The TensorFlow compression driver: one replacement of Horovod's gradient allreduce
runs every compression strategy, built-in TopK and a registered compressor alike, on
the tape and on the Keras optimizer.

A compression strategy's spec names its synchronizer (its catalogue entry's
``synchronizer``: :data:`hvdx.core.compression_protocol.SYNCHRONIZER_METHODS`), the
same object the PyTorch driver (:mod:`hvdx.torch.compression_driver`) runs; this
module only hands it TensorFlow's gradients.

Horovod's ``DistributedGradientTape`` and Keras ``DistributedOptimizer`` funnel the
gradients through one function, ``_allreduce_grads(grads, vars)``, after setting aside
the variables registered as local (``register_local_source``/``register_local_var``);
hvdx builds Horovod's object and replaces that function, on this instance only
(:mod:`hvdx.tensorflow.allreduce_replacement`), by :func:`make_allreduce_grads`. One
call:

1. takes the gradients in the order of the variables (the order the fingerprint
   checked); a missing gradient is zeros (another rank may have one), an
   ``IndexedSlices`` gradient is made dense (TopK leaves it to Horovod's average; a
   registered compressor compresses it);
2. runs the whole numpy step inside ONE ``tf.py_function`` that takes every gradient
   and returns every update. Eagerly, the same Python function is called directly (no
   py_function), so errors keep their Python type. Inside a ``tf.function`` (and Keras
   ``fit``) the py_function is traced once and runs at every step, so the residuals and
   the step counter live in Python, not in the graph;
3. in it: every rank names its first non-finite gradient and the synchronizer agrees
   on it. If any rank has one, every rank returns NaN for every gradient and nothing
   else happens in that call (no residual, step counter or byte counter changes):
   Horovod's allreduce would carry the inf/NaN into every rank's average, and a Keras
   ``LossScaleOptimizer`` (``mixed_float16``) counts on that to skip the step and
   lower its scale on every rank together;
4. the tensors the synchronizer leaves dense (TopK: fewer than ``min_size`` entries,
   sparse gradients, the warm-up steps) go through ONE
   ``horovod.tensorflow.grouped_allreduce``, run eagerly inside the py_function:
   Horovod's own reduction (same op, prescale/postscale, process set, tensor fusion);
5. the others go to the synchronizer as flat numpy arrays (float32; float64 stays
   float64 where the synchronizer keeps it), over mpi4py on hvdx's communicator, which
   matches Horovod's process set; the results come back in each gradient's shape and
   dtype.

Why a py_function and not TensorFlow ops: the synchronizers' exchanges are numpy and
mpi4py, with payloads that may differ in size on every rank, and their residuals are
Python state shared with the PyTorch driver; one py_function per step runs that shared
code unchanged, so TensorFlow's updates are bitwise PyTorch's and the numpy reference's.

State: a :class:`~hvdx.tensorflow.compression_residuals.CompressionState` (a
``tf.Module``). Keras: the optimizer tracks it under the synchronizer's
``TENSORFLOW_ATTRIBUTE`` (``optimizer.hvdx_topk``, ``optimizer.hvdx_compression``), so
a checkpoint of the model or of the optimizer includes it. Tape: a tape lives one step,
so the state is kept per list of variables (``hvd.topk_state(variables)``,
``hvd.compression_state(variables)``)::

    state = hvd.topk_state(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=opt, topk=state)
"""

from __future__ import annotations

from typing import List

import numpy as np
import tensorflow as tf
import horovod.tensorflow as _hvd

from hvdx.core.finite import first_nonfinite
from hvdx.mpi import communicator_for
from hvdx.strategies import catalogue
from hvdx.tensorflow.allreduce_replacement import eagerly, on_keras_optimizer, on_tape
from hvdx.tensorflow.compression_residuals import CompressionState, tape_state

__all__ = ["keras_adapter", "make_allreduce_grads", "tape_adapter", "tape_counters"]


def _keys(variables) -> List[str]:
    """Residual keys by position, as the fingerprint names them: Keras makes layer names
    unique per process (``dense_1``), so a restored model's variables may be named
    differently from the saved one's while their order is the same."""
    return [f"variable[{i}]" for i in range(len(variables))]


def make_allreduce_grads(spec, op, gradient_predivide_factor, process_set, state_of):
    """A replacement for Horovod's ``_allreduce_grads(grads, vars, ...)`` (steps 1 to 5).

    Args:
        state_of: ``variables -> CompressionState`` (the optimizer's own, or the
            tapes').
    """
    sum_op = op == _hvd.Sum
    prescale = postscale = 1.0
    if op == _hvd.Average and gradient_predivide_factor != 1.0:
        prescale, postscale = 1.0 / gradient_predivide_factor, gradient_predivide_factor
    name = f"{catalogue.synchronizer_of(spec).TENSORFLOW_ATTRIBUTE}_synchronize"

    # Plain Python at trace time: AutoGraph would otherwise try to convert everything it
    # calls (the synchronizer, mpi4py), which costs tens of seconds and changes nothing.
    @tf.autograph.experimental.do_not_convert
    def allreduce_grads(grads, variables, *unused_args, **unused_kwargs):
        structure = grads
        grads, variables = tf.nest.flatten(grads), tf.nest.flatten(variables)
        if len(grads) != len(variables):
            raise ValueError(f"got {len(grads)} gradients for {len(variables)} variables")
        if not grads or not process_set.included():
            # Outside process_set a rank keeps its own gradients, as Horovod's
            # allreduce leaves them there.
            return structure
        comm = communicator_for(process_set, _hvd.global_process_set, _hvd.size())
        sync = state_of(variables).bind(_keys(variables), spec, comm, sum_op,
                                        [v.name for v in variables],
                                        [tuple(v.shape) for v in variables])
        force_dense = [i for i, g in enumerate(grads) if isinstance(g, tf.IndexedSlices)]
        tensors = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                   for g, v in zip(grads, variables)]

        def step(*values):
            return _step(sync, values, force_dense, op, prescale, postscale, process_set)

        return tf.nest.pack_sequence_as(structure, eagerly(step, tensors, name))

    return allreduce_grads


def _step(sync, tensors, force_dense, op, prescale, postscale, process_set):
    """Steps 3 to 5 on eager tensors; returns one tensor per gradient."""
    arrays = [t.numpy() for t in tensors]
    results = list(tensors)

    def start_dense(positions):
        # Horovod's reduction for the tensors left dense: one fused, synchronous call.
        if positions:
            reduced = _hvd.grouped_allreduce(
                [tensors[p] for p in positions], op=op, prescale_factor=prescale,
                postscale_factor=postscale, process_set=process_set)
            for p, r in zip(positions, reduced):
                results[p] = r
        return None

    def flat(position):
        a = arrays[position]
        keep = sync.KEEPS_FLOAT64 and a.dtype == np.float64
        return a.reshape(-1).astype(np.float64 if keep else np.float32, copy=False)

    # Once TopK's autotune chose dense, Horovod's allreduce alone: no NaN/Inf agreement.
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
        results[p] = tf.cast(update, tensors[p].dtype) if tensors[p].dtype != update.dtype \
            else update
    return results


# --- every compression strategy's entries in hvdx.tensorflow.registry (the catalogue's
# defaults for the kind "compression": hvdx.strategies.descriptor.COMPRESSION_DRIVERS) --

# Plain Python, often called while a tf.function is traced: nothing to convert.
@tf.autograph.experimental.do_not_convert
def tape_adapter(horovod, spec, setup, args, gradtape):
    """``DistributedGradientTape``: Horovod's tape, with the strategy on it (the
    arguments passed the spec's job checks)."""
    cls = catalogue.synchronizer_of(spec)
    tape = on_tape(horovod(), make_allreduce_grads(
        spec, args.op, args.gradient_predivide_factor, args.process_set,
        lambda variables: tape_state(cls, variables)))
    object.__setattr__(tape, "_hvdx_synchronizer_class", cls)  # for tape_counters
    return tape


def keras_adapter(horovod, spec, setup, args, optimizer):
    """Keras' ``DistributedOptimizer``: Horovod's optimizer, with the strategy on it;
    its state is tracked as ``optimizer.<TENSORFLOW_ATTRIBUTE>`` (``hvdx_topk``,
    ``hvdx_compression``), its bytes are ``optimizer.hvdx_stats``."""
    cls = catalogue.synchronizer_of(spec)
    state = CompressionState(cls)
    return on_keras_optimizer(horovod(), state, cls.TENSORFLOW_ATTRIBUTE,
                              make_allreduce_grads(spec, args.op,
                                                   args.gradient_predivide_factor,
                                                   args.process_set,
                                                   lambda variables: state))


def tape_counters(tape, variables):
    """The counters of the state of the variables the tape reduced (for the step log)."""
    local = getattr(tape, "_local_sources", ())  # Horovod keeps these out
    kept = [v for v in variables if v.ref() not in local]
    return tape_state(tape._hvdx_synchronizer_class, kept).stats
