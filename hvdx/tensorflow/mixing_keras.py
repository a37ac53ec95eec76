"""The parameter-mixing strategies' Keras ``DistributedOptimizer``: a local step, then
the mix.

``apply_gradients`` steps locally and then mixes (adapt-then-combine), or mixes first
when the mixer ``combines_first`` (combine-then-adapt), with the state
:class:`hvdx.tensorflow.mixing_state.MixingState`. It keeps Horovod's Keras optimizer
API (``_compute_gradients``, ``register_local_var``, ``backward_passes_per_step``
through Horovod's ``_agg_helper``): see :class:`_KerasMixing` for what each means when
parameters, not gradients, are averaged.
"""

from __future__ import annotations

import numbers
from typing import List

import horovod.tensorflow as _hvd
import horovod.tensorflow.util as _hvd_util
import tensorflow as tf
from horovod.tensorflow.gradient_aggregation import LocalGradientAggregationHelper
from horovod.tensorflow.gradient_aggregation_eager import (
    LocalGradientAggregationHelperEager)

from hvdx.tensorflow.mixing_state import MixingState, new_state
from hvdx.tensorflow.mixing_tape import extra_variables, scale_local

__all__ = ["keras_adapter", "loss_scaling", "make_mixing_keras_optimizer"]


def keras_adapter(horovod, sync, setup, args, optimizer):
    """Every mixing strategy's Keras ``DistributedOptimizer`` in
    :mod:`hvdx.tensorflow.registry` (the catalogue names it): an optimizer whose
    ``apply_gradients`` steps locally and mixes, before the local step if the mixer
    ``combines_first``, with Horovod's Keras optimizer API
    (:func:`make_mixing_keras_optimizer`). Horovod's aggregation arguments were compared
    across ranks with ``sync``, so a wrong value is refused on every rank."""
    what = "keras DistributedOptimizer"
    state = new_state(sync, setup, args.checked_settings)
    passes = args.backward_passes_per_step
    if isinstance(passes, bool) or not isinstance(passes, numbers.Integral) or passes < 1:
        raise ValueError(
            f"hvdx {what}: backward_passes_per_step={passes!r} must be a whole number "
            f">= 1 with hvdx.{type(sync).__name__} (1: a local step and a mix every "
            "pass; N: the gradients of N passes summed locally, then one local step and "
            "one mix)")
    return make_mixing_keras_optimizer(
        optimizer, state, sync.state_key, combine_first=bool(state._mixer.combines_first),
        extra=args.non_trainable_variables, backward_passes_per_step=int(passes),
        average_aggregated_gradients=args.average_aggregated_gradients,
        sparse_as_dense=args.sparse_as_dense,
        scale_local_gradients=args.scale_local_gradients)


def loss_scaling(optimizer) -> bool:
    """Whether a loss scale may skip ``optimizer``'s steps on some ranks only: under
    Keras' ``mixed_float16`` policy (``compile`` then wraps it in a LossScaleOptimizer),
    or if it is one."""
    mixed_precision = tf.keras.mixed_precision
    scaled = isinstance(optimizer, mixed_precision.LossScaleOptimizer)
    return scaled or mixed_precision.global_policy().compute_dtype == "float16"


def _agree_on_overflow(optimizer, grads_and_vars):
    """``grads_and_vars`` with the first gradient made infinite on every rank if any
    rank's gradients are not all finite (collective, under :func:`loss_scaling`)."""
    grads_and_vars = list(grads_and_vars)
    present = [i for i, (g, _) in enumerate(grads_and_vars) if g is not None]
    if _hvd.size() == 1 or not present or not loss_scaling(optimizer):
        return grads_and_vars
    values = [grads_and_vars[i][0] for i in present]
    values = [v.values if isinstance(v, tf.IndexedSlices) else v for v in values]
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in values])
    overflows = _hvd.allreduce(1.0 - tf.cast(finite, tf.float32), op=_hvd.Sum,
                               name=f"hvdx.{optimizer._hvdx_state._sync.name}.overflow")
    first = present[0]
    g, v = grads_and_vars[first]
    dense = tf.convert_to_tensor(g)
    poisoned = tf.where(overflows > 0, tf.fill(tf.shape(dense), tf.constant(
        float("inf"), dense.dtype)), dense)
    grads_and_vars[first] = (poisoned, v)
    return grads_and_vars


def make_mixing_keras_optimizer(optimizer, state: MixingState, attribute: str,
                                combine_first: bool = False, extra=None,
                                backward_passes_per_step: int = 1,
                                average_aggregated_gradients: bool = False,
                                sparse_as_dense: bool = False,
                                scale_local_gradients: bool = True):
    """A Keras optimizer of a run-time subclass of ``optimizer``'s class, rebuilt from its
    config as Horovod rebuilds it, whose ``apply_gradients`` also mixes.

    1. the class gets :class:`_KerasMixing`'s members: Horovod's Keras optimizer API
       (``_compute_gradients``, ``_allreduce``, ``register_local_var``, ``_agg_helper``)
       with parameter mixing's meaning, and the local step plus the mix;
    2. ``result.<attribute>`` is ``state``, tracked (saved with the optimizer), also
       by the legacy optimizers, which track no attribute by themselves;
    3. ``backward_passes_per_step > 1``: Horovod's own aggregation helper sums the
       passes (its counter, its ``average_aggregated_gradients`` and
       ``sparse_as_dense``), and calls the optimizer's step, local step and mix,
       every N passes only.

    ``combine_first``: mix before the local step (combine-then-adapt); ``extra``:
    ``non_trainable_variables=``.
    """
    base = optimizer.__class__
    namespace = {name: value for name, value in _KerasMixing.__dict__.items()
                 if not name.startswith("__")}
    # Hooks of one family of Keras optimizers only: get_gradients and add_slot are the
    # legacy ones', add_variable_from_reference the new ones'.
    for name in ("get_gradients", "add_slot", "add_variable_from_reference"):
        if not hasattr(base, name):
            del namespace[name]
    namespace.update(_hvdx_base=base, _hvdx_attribute=attribute,
                     _hvdx_combine_first=combine_first)
    cls = type(base.__name__, (base,), namespace)
    opt = cls.from_config(optimizer.get_config())
    setattr(opt, attribute, state)
    if getattr(opt, "_lookup_dependency", None) is not None:
        opt._maybe_initialize_trackable()  # legacy optimizers build it when first needed
        if opt._lookup_dependency(attribute) is None:
            opt._track_trackable(state, name=attribute)
    helper = None
    if backward_passes_per_step > 1:
        # Horovod's choice of helper (horovod/_keras): the eager one unless built in a
        # TF1 graph. Its "allreduce" is this optimizer's: the local gradients.
        if _hvd_util._executing_eagerly():
            helper = LocalGradientAggregationHelperEager(
                backward_passes_per_step=backward_passes_per_step,
                allreduce_func=_local_gradients, sparse_as_dense=sparse_as_dense,
                average_aggregated_gradients=average_aggregated_gradients,
                process_set=_hvd.global_process_set,
                scale_local_gradients=scale_local_gradients)
        else:
            helper = LocalGradientAggregationHelper(
                backward_passes_per_step=backward_passes_per_step,
                allreduce_func=_local_gradients, sparse_as_dense=sparse_as_dense,
                average_aggregated_gradients=average_aggregated_gradients,
                rank=_hvd.rank(),
                optimizer_type=LocalGradientAggregationHelper._OPTIMIZER_TYPE_KERAS,
                process_set=_hvd.global_process_set,
                scale_local_gradients=scale_local_gradients)
    # Not tracked (a list or dict attribute of a Keras object would be wrapped and
    # saved). Horovod's names where Horovod's optimizer has them.
    for name, value in dict(
            _hvdx_extra=extra, _hvdx_slot_of={}, _local_vars=set(), _agg_helper=helper,
            _allreduce_grads=_local_gradients, _aggregated_gradients=False,
            process_set=_hvd.global_process_set,
            scale_local_gradients=scale_local_gradients).items():
        object.__setattr__(opt, name, value)
    return opt


def _local_gradients(grads, variables, *unused_args, **unused_kwargs):
    """Parameter mixing's "allreduce": none, every rank applies its own gradients (and
    then mixes parameters). Horovod's aggregation helper calls it every N passes."""
    return list(grads)


class _KerasMixing:
    """Members copied into the run-time optimizer class; ``_hvdx_base`` is the user's.

    Horovod's Keras optimizer API (``horovod/_keras``: what subclasses, callbacks and
    Horovod's own tests call), with parameter mixing's meaning:

    - ``compute_gradients``/``_compute_gradients``/``get_gradients``: the LOCAL
      gradients, through :meth:`_allreduce`, which sends nothing;
    - ``backward_passes_per_step=N`` (``_agg_helper``, Horovod's helper): the gradients
      of N passes are summed locally (divided by N with
      ``average_aggregated_gradients``); every N-th ``apply_gradients`` takes one local
      step and one mix, the others only count ``iterations``, as Horovod's do. The
      schedule (DS-Sync's groups, the graph's peers) advances once per applied step;
    - ``register_local_var(v)``: ``v`` is never mixed (nor its optimizer slots, nor its
      SWA mean, nor by ``synchronize_parameters``); its gradient is this rank's, divided
      by the number of ranks with ``scale_local_gradients`` (Horovod's scaling). Every
      rank registers the same variables before the first step: the positions join the
      first step's cross-rank check.
    """

    @property
    def _hvdx_state(self) -> MixingState:
        return getattr(self, self._hvdx_attribute)

    @property
    def hvdx_stats(self):
        return self._hvdx_state.hvdx_stats

    # --- Horovod's Keras optimizer API --------------------------------------------------

    def register_local_var(self, var):
        """Keep ``var`` on this rank: its gradient stays local (as under Horovod) and
        the strategy never mixes it (class docstring).

        Raises:
            ValueError: after the first step, whose cross-rank check fixed the mixed
                variables: register every local variable before training.
        """
        state = self._hvdx_state
        if state._bound.variables is not None:
            strategy = type(state._sync).__name__
            raise ValueError(
                f"register_local_var({var.name!r}): hvdx.{strategy} fixed the variables "
                "it mixes at its first step; register local variables before the first "
                "step, on every rank")
        self._local_vars.add(var.ref())
        if self._agg_helper is not None:
            self._agg_helper.register_local_var(var)  # it scales them, as Horovod's

    # Mixed precision: one decision to skip a step, on every rank. A LossScaleOptimizer
    # (Keras wraps the optimizer in one under the mixed_float16 policy) applies a step
    # only if the gradients it gets are finite; the mix inside that step would then wait
    # for a rank that skipped it. So the gradients are made non-finite on every rank as
    # soon as they are on one (Horovod's allreduce of one flag), and every rank skips,
    # and halves its loss scale, together.

    def compute_gradients(self, loss, var_list, tape=None):
        return self._compute_gradients(loss, var_list, None, tape)

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """The base optimizer's gradients, through :meth:`_allreduce` (as Horovod's)."""
        tape = tf.GradientTape() if tape is None else tape
        base = self._hvdx_base
        if hasattr(base, "_compute_gradients"):  # legacy optimizers
            pairs = base._compute_gradients(self, loss, var_list, grad_loss, tape=tape)
        else:
            pairs = base.compute_gradients(self, loss, var_list, tape=tape)
        grads, variables = zip(*pairs)
        return _agree_on_overflow(self, zip(self._allreduce(grads, variables), variables))

    def get_gradients(self, loss, params):  # legacy optimizers, graph mode
        grads = self._allreduce(self._hvdx_base.get_gradients(self, loss, params), params)
        return [g for g, _ in _agree_on_overflow(self, zip(grads, params))]

    def _aggregate_gradients(self, grads_and_vars):
        # Horovod's helper calls it on the passes that apply nothing (TF >= 2.4).
        base = self._hvdx_base
        if hasattr(base, "_aggregate_gradients"):
            return base._aggregate_gradients(self, grads_and_vars)
        return base.aggregate_gradients(self, grads_and_vars)

    def _allreduce(self, grads, variables):
        """Horovod's step from this rank's gradients to the applied ones: here the local
        gradients (summed over N passes by ``_agg_helper``), those of local variables
        scaled as Horovod scales them (:func:`hvdx.tensorflow.mixing_tape.scale_local`).
        Sends nothing."""
        object.__setattr__(self, "_aggregated_gradients", True)
        if self._agg_helper is not None:
            return self._agg_helper.compute_gradients(tuple(grads), tuple(variables))
        return scale_local(grads, variables, self._local_vars, self.scale_local_gradients)

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        """The local step and the mix (:meth:`_hvdx_apply`); with
        ``backward_passes_per_step > 1``, every N-th call only (Horovod's helper)."""
        grads_and_vars = list(grads_and_vars)  # a zip is read once
        if self._agg_helper is None:
            return self._hvdx_apply(grads_and_vars, *args, **kwargs)
        return self._agg_helper.apply_gradients(
            lambda: self._hvdx_apply(grads_and_vars, *args, **kwargs), self,
            grads_and_vars, *args, **kwargs)

    # --- one step: the local step and the mix ----------------------------------------

    def _hvdx_apply(self, grads_and_vars, *args, **kwargs):
        """The local step and the mix, in the strategy's order (module docstring).

        The registered local variables are left out of the mix; their positions join
        the first step's cross-rank check, so that ranks which registered different
        variables (even of the same shapes) fail on every rank instead of mixing
        unrelated values.
        """
        state = self._hvdx_state
        what = "keras DistributedOptimizer"
        variables = [v for _, v in grads_and_vars] + extra_variables(self._hvdx_extra, what)
        local = self._local_vars
        state.bind([v for v in variables if v.ref() not in local], what, settings=[(
            "register_local_var", [i for i, v in enumerate(variables) if v.ref() in local])])
        if self._hvdx_combine_first:
            if state._sync.average_optimizer_state:
                self._hvdx_build_slots([v for _, v in grads_and_vars])
            state.average(self._hvdx_slots())
            return self._hvdx_base.apply_gradients(self, grads_and_vars, *args, **kwargs)
        result = self._hvdx_base.apply_gradients(self, grads_and_vars, *args, **kwargs)
        state.average(self._hvdx_slots())
        return result

    def synchronize_parameters(self, swa: bool = False):
        """Average the variables (and slots, if configured) over all ranks now; the
        registered local variables stay as they are.

        See :meth:`MixingState.synchronize_parameters`.
        """
        self._hvdx_state.synchronize_parameters(swa=swa, extra=self._hvdx_slots())

    # --- the optimizer's slots -------------------------------------------------------

    def add_slot(self, var, slot_name, *args, **kwargs):  # legacy optimizers
        slot = self._hvdx_base.add_slot(self, var, slot_name, *args, **kwargs)
        self._hvdx_slot_of[slot.ref()] = var.ref()
        return slot

    def add_variable_from_reference(self, model_variable, variable_name, *args,
                                    **kwargs):  # new optimizers
        slot = self._hvdx_base.add_variable_from_reference(self, model_variable,
                                                           variable_name, *args, **kwargs)
        self._hvdx_slot_of[slot.ref()] = model_variable.ref()
        return slot

    def _hvdx_build_slots(self, variables) -> None:
        """Create the slots now (Keras creates them in its first ``apply_gradients``,
        after a combine-then-adapt step has mixed): idempotent, outside any graph."""
        with tf.init_scope():
            if hasattr(self, "_create_all_weights"):  # legacy optimizers
                self._create_all_weights(variables)
            else:
                self.build(variables)

    def _hvdx_slots(self) -> List[tf.Variable]:
        """With ``average_optimizer_state``: the optimizer's slots (momenta, Adam
        moments) of the mixed variables, in the optimizer's order (the same on every
        rank); never those of a registered local variable, the iteration count, nor
        scalars it made otherwise (learning rate).

        A slot made by Keras' ``add_slot``/``add_variable_from_reference`` is known by
        its variable; another optimizer variable counts if shaped like a mixed one.
        """
        state = self._hvdx_state
        if not state._sync.average_optimizer_state:
            return []
        variables = self.variables() if callable(self.variables) else self.variables
        mixed = {v.ref() for v in state._variables}
        shapes = {tuple(v.shape) for v in state._variables}
        slots = []
        for v in variables:
            if v is self.iterations or not v.dtype.is_floating:
                continue
            owner = self._hvdx_slot_of.get(v.ref())
            if owner is not None:
                keep = owner in mixed
            else:
                keep = bool(v.shape.rank) and tuple(v.shape) in shapes
            if keep:
                slots.append(v)
        return slots
