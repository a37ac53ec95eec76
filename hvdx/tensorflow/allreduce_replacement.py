"""How a compression strategy takes the place of Horovod's gradient allreduce on
Horovod's own TensorFlow objects (for the compression driver,
:mod:`hvdx.tensorflow.compression_driver`).

Horovod's tape and Keras optimizer stay what they are (their API, their checks, their
aggregation of several backward passes); only their ``_allreduce_grads``, the function
that reduces the gradients, is this instance's replacement:

1. on a tape, the instance attribute shadows the method (:func:`on_tape`);
2. on a Keras optimizer (:func:`on_keras_optimizer`), the strategy's state becomes a
   tracked attribute, so a checkpoint of the optimizer holds its residuals, and
   ``hvdx_stats`` its byte counters; with ``backward_passes_per_step > 1`` Horovod's
   helper sums N passes locally, then calls the function it was given at construction
   (the eager helper names it ``allreduce_grads``, the graph one ``_allreduce_grads``):
   this instance's helper gets the replacement too.

:func:`eagerly` runs a replacement's exchange (eager Python on numpy) inside a graph
too.
"""

from typing import Callable, List

import tensorflow as tf

__all__ = ["eagerly", "on_keras_optimizer", "on_tape"]


def on_tape(tape, allreduce_grads: Callable):
    """Horovod's tape ``tape``, reducing its gradients with ``allreduce_grads``."""
    object.__setattr__(tape, "_allreduce_grads", allreduce_grads)
    return tape


def on_keras_optimizer(opt, state, attribute: str, allreduce_grads: Callable):
    """Horovod's Keras optimizer ``opt``, reducing with ``allreduce_grads``; ``state``
    (a ``tf.Module`` with ``stats``) tracked as ``opt.<attribute>``."""
    setattr(opt, attribute, state)
    if getattr(opt, "_lookup_dependency", None) is not None:
        # Legacy (OptimizerV2) optimizers track no attribute by itself and build their
        # table of dependencies only when first needed: build it, then track by name.
        opt._maybe_initialize_trackable()
        if opt._lookup_dependency(attribute) is None:
            opt._track_trackable(state, name=attribute)
    opt.hvdx_stats = state.stats  # the step log reads it
    object.__setattr__(opt, "_allreduce_grads", allreduce_grads)
    helper = getattr(opt, "_agg_helper", None)
    if helper is not None:
        for name in ("allreduce_grads", "_allreduce_grads"):
            if hasattr(helper, name):
                object.__setattr__(helper, name, allreduce_grads)
    return opt


def eagerly(step: Callable, tensors: List[tf.Tensor], name: str) -> List[tf.Tensor]:
    """``step(*tensors)`` (the exchange, eager Python on numpy): called at once when
    executing eagerly, else through one ``tf.py_function`` named ``name`` whose outputs
    get their inputs' static shapes back (a ``py_function``'s are unknown)."""
    if tf.executing_eagerly():
        return list(step(*tensors))
    out = tf.py_function(step, tensors, Tout=[t.dtype for t in tensors], name=name)
    for o, t in zip(out, tensors):
        o.set_shape(t.shape)
    return list(out)
