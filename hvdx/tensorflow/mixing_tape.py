"""The parameter-mixing strategies' ``DistributedGradientTape``: local gradients, then
the mix.

``gradient()`` returns the LOCAL gradients ``g(x_t)`` and, once they are computed,
mixes the variables (:meth:`hvdx.tensorflow.mixing_state.MixingState.average`), so the
optimizer applies ``g(x_t)`` to the mixed variables: combine-then-adapt,
``x_{t+1} = sum_j W_t[i, j] x_j - lr g(x_t)`` (D-PSGD, Lian et al., arXiv
1705.09056), the one order a tape can run (it cannot see the optimizer's step). A
script builds a tape every step, so the state belongs to the spec object
(:func:`hvdx.tensorflow.mixing_state.state_of`). ``non_trainable_variables=``
(BatchNorm's moving statistics) are mixed with the trained variables; Horovod's
``register_local_source`` keeps a variable out of the mix.
"""

from __future__ import annotations

from typing import Dict, List

import horovod.tensorflow as _hvd
import tensorflow as tf

from hvdx.tensorflow.mixing_state import MixingState, tape_state

__all__ = ["extra_variables", "make_mixing_tape", "scale_local", "tape_adapter",
           "tape_counters"]

# Run-time tape classes, one per (user tape class, state attribute).
_TAPE_CLASSES: Dict[tuple, type] = {}


# Often called while a tf.function is traced: AutoGraph must not convert (slowly, and
# uselessly: no tensor decides anything here) the registration and mpi4py code below.
@tf.autograph.experimental.do_not_convert
def tape_adapter(horovod, sync, setup, args, gradtape):
    """Every mixing strategy's ``DistributedGradientTape`` in
    :mod:`hvdx.tensorflow.registry` (the catalogue names it): ``gradtape`` as a tape
    whose ``gradient`` mixes (:func:`make_mixing_tape`) with the state the tapes given
    ``sync`` share (``args``: :class:`hvdx.tensorflow.registry.GradientArguments`)."""
    state = tape_state(sync, setup, args.checked_settings)
    sync.check_tape()
    return make_mixing_tape(gradtape, state, sync.state_key, args.non_trainable_variables,
                            args.scale_local_gradients)


@tf.autograph.experimental.do_not_convert
def make_mixing_tape(gradtape, state: MixingState, attribute: str, extra=None,
                     scale_local_gradients: bool = True):
    """``gradtape`` as an instance of a run-time subclass whose ``gradient`` mixes.

    ``isinstance(result, type(gradtape))`` holds; the recorded operations are shared.
    ``result.<attribute>`` is ``state``; ``extra``: ``non_trainable_variables=``. It
    keeps Horovod's tape API ``register_local_source(v)``: ``v`` is never mixed, and
    its gradient is divided by the number of ranks with ``scale_local_gradients``, as
    Horovod's tape divides it (:func:`_scale_local`).
    """
    base = gradtape.__class__
    key = (base, attribute)
    if key not in _TAPE_CLASSES:
        _TAPE_CLASSES[key] = type(base.__name__, (base,), {
            "gradient": _tape_gradient, "_hvdx_base": base,
            "register_local_source": _register_local_source,
            attribute: property(lambda self: self._hvdx_state)})
    tape = _TAPE_CLASSES[key].__new__(_TAPE_CLASSES[key])
    # Share the recorded tape and its flags (Horovod's own wrapper shares ``_tape`` too).
    tape.__dict__.update(gradtape.__dict__)
    tape._hvdx_state = state
    tape._hvdx_extra = extra
    tape._local_sources = set()  # Horovod's tape's name for them
    tape._hvdx_scale_local = scale_local_gradients
    return tape


def _register_local_source(self, source):
    """Horovod's ``register_local_source``: ``source`` stays on this rank (never mixed;
    its gradient is the local one, divided by the number of ranks with
    ``scale_local_gradients``). A tape is made each step: register on each, on every
    rank, before ``gradient``; the variables mixed are fixed at the first step, so a
    later change is refused, naming them."""
    self._local_sources.add(source.ref())


@tf.autograph.experimental.do_not_convert
def _tape_gradient(self, target, sources, output_gradients=None, *args, **kwargs):
    """Local gradients; then the sources (and buffers) are replaced by their mix."""
    grads = self._hvdx_base.gradient(self, target, sources, output_gradients, *args,
                                     **kwargs)
    state = self._hvdx_state
    what = "DistributedGradientTape"
    flat = tf.nest.flatten(sources)
    local = self._local_sources
    state.bind([s for s in flat if s.ref() not in local]
               + extra_variables(self._hvdx_extra, what), what)
    if local:
        grads = tf.nest.pack_sequence_as(
            grads, scale_local(tf.nest.flatten(grads), flat, local, self._hvdx_scale_local))
    # The mix must not overtake the gradients (they are taken at x_t).
    ready = [g.values if isinstance(g, tf.IndexedSlices) else g
             for g in tf.nest.flatten(grads) if g is not None]
    with tf.control_dependencies(ready):
        state.average()
    return grads


def extra_variables(non_trainable_variables, what: str) -> List[tf.Variable]:
    """The floating-point variables of ``non_trainable_variables=`` (a list, or a
    callable returning one, such as ``lambda: model.non_trainable_variables``)."""
    if non_trainable_variables is None:
        return []
    if callable(non_trainable_variables):
        non_trainable_variables = non_trainable_variables()
    try:
        variables = list(non_trainable_variables)
    except TypeError:
        raise ValueError(f"hvdx {what}: non_trainable_variables="
                         f"{non_trainable_variables!r} must be a list of tf.Variable "
                         "(model.non_trainable_variables) or a callable returning "
                         "one") from None
    for i, v in enumerate(variables):
        if not isinstance(v, tf.Variable):
            raise ValueError(f"hvdx {what}: non_trainable_variables[{i}] is a "
                             f"{type(v).__name__}, not a tf.Variable")
    # Integer counters (a step count) are not averaged, as torch's num_batches_tracked.
    return [v for v in variables if v.dtype.is_floating]


def scale_local(grads, variables, local, scale: bool):
    """Horovod's scaling of the gradients of registered local variables by 1/size
    (``scale_local_gradients``): the learning rate of Horovod's recipe is scaled by the
    number of ranks for the averaged gradients; a local variable's own gradient is
    divided back. Under parameter mixing every trained variable applies its own
    gradient and the mix averages the result, so the same recipe holds, and a local
    variable steps as under Horovod."""
    if not scale or not local:
        return list(grads)
    size = _hvd.size()
    out = []
    for g, v in zip(grads, variables):
        if g is not None and v.ref() in local:
            g = (tf.IndexedSlices(g.values / size, g.indices, g.dense_shape)
                 if isinstance(g, tf.IndexedSlices) else g / size)
        out.append(g)
    return out


def tape_counters(tape, variables):
    """The counters of DS-Sync's and the graphs' tapes (for the step log, through
    :mod:`hvdx.tensorflow.registry`): the state the tape mixes with."""
    return getattr(getattr(tape, "_hvdx_state", None), "hvdx_stats", None)
