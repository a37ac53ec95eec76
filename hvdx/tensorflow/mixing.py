"""The parameter-mixing strategies' shared TensorFlow part: local steps, then a mixer.

DS-Sync (:mod:`hvdx.strategies.dssync.tensorflow.adapters`) and decentralized SGD
(:mod:`hvdx.strategies.decentralized.tensorflow.adapters`) send no gradients: every rank steps
locally and then averages its variables with other ranks. What they share lives here once:

- :class:`MixingState` (a ``tf.Module``, so it checkpoints): the step counter, the SWA
  running means, the variables it mixes (checked across ranks when first seen),
  ``synchronize_parameters()``. A strategy subclasses it with its *mixer*:
  ``_mix_at(step, values)`` (this step's averaging) and ``_average_all(values)``;
- :func:`make_mixing_tape`: ``DistributedGradientTape``'s ``gradient()`` returns the
  LOCAL gradients ``g(x_t)`` and, once they are computed, mixes the variables, so the
  optimizer applies ``g(x_t)`` to the mixed variables (combine-then-adapt: the tape
  cannot see the optimizer's step);
- :func:`make_mixing_keras_optimizer`: the Keras optimizer's ``apply_gradients`` steps
  locally and then mixes (adapt-then-combine), or mixes first (combine-then-adapt). It
  keeps Horovod's Keras optimizer API (``_compute_gradients``, ``register_local_var``,
  ``backward_passes_per_step`` through Horovod's ``_agg_helper``): see
  :class:`_KerasMixing` for what each means when parameters, not gradients, are averaged;
- ``non_trainable_variables=`` (Keras' BatchNorm moving statistics) are mixed with the
  trained variables, so that ranks evaluate alike after ``synchronize_parameters()``.

How one mixing step runs, eagerly, inside ``tf.function`` and in Keras ``fit`` alike:
the values go through one ``tf.py_function`` whose body (eager Python) picks this
step's peers from the step variable and runs the strategy's communication; the graph
then assigns the results. Every rank runs the same steps in the same order, so every
rank joins the same communication.
"""

from __future__ import annotations

import numbers
from typing import Dict, List, Optional, Sequence

import horovod.tensorflow as _hvd
import horovod.tensorflow.util as _hvd_util
import tensorflow as tf
from horovod.tensorflow.gradient_aggregation import LocalGradientAggregationHelper
from horovod.tensorflow.gradient_aggregation_eager import (
    LocalGradientAggregationHelperEager)

from hvdx.core.fingerprint import Fingerprint
from hvdx.core.group_averaging import running_mean
from hvdx.mpi import check_consistent, communicator_for
from hvdx.tensorflow.jobs import job, resolve_sync

__all__ = ["MixingState", "adapters", "average_over_all_ranks", "extra_variables",
           "loss_scaling", "make_mixing_keras_optimizer", "make_mixing_tape",
           "mixing_keras_optimizer", "mixing_tape", "new_state", "state_of",
           "tape_counters", "tape_state"]

# Run-time tape classes, one per (user tape class, state attribute).
_TAPE_CLASSES: Dict[tuple, type] = {}


class MixingState(tf.Module):
    """One model's mixing state: step, SWA running means, the variables it mixes.

    A strategy's subclass sets :attr:`STRATEGY` and :attr:`ATTRIBUTE`, builds itself
    from the resolved plan (:meth:`from_plan`) and implements its mixer (``_mix_at``,
    ``_average_all``); :func:`mixing_tape`, :func:`mixing_keras_optimizer` and
    :func:`state_of` do the rest.

    Attributes:
        step: ``tf.Variable`` (int64), steps taken: the schedule's position.
        swa_count: ``tf.Variable`` (int64), samples in the SWA running mean.
        swa: the SWA running means, one variable per mixed variable (empty until the
            first step binds the variables).
    """

    #: The spec class (``hvdx.DSSync``, ``hvdx.Decentralized``).
    STRATEGY: type = type(None)
    #: The attribute that holds the state on the tape and on the Keras optimizer.
    ATTRIBUTE = ""

    @classmethod
    def from_plan(cls, sync, plan) -> "MixingState":
        """The state for ``sync`` and its resolved plan (collective where it must be)."""
        raise NotImplementedError

    @classmethod
    def check_tape(cls, sync) -> None:
        """Refuse what the tape cannot run (after the cross-rank check)."""

    @classmethod
    def combines_first(cls, sync) -> bool:
        """Whether the Keras optimizer mixes before its local step."""
        return False

    def __init__(self, sync, name: str):
        super().__init__(name=name)
        self._sync = sync
        # Built eagerly even when the first tape is made while a tf.function is traced.
        with tf.init_scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            self.swa_count = tf.Variable(0, dtype=tf.int64, trainable=False,
                                         name="swa_count")
        self.swa: List[tf.Variable] = []
        self._bound = _Bound()

    @property
    def _variables(self) -> List[tf.Variable]:
        return self._bound.variables

    # --- the mixer (subclasses) -------------------------------------------------------

    def _mix_at(self, step: int, values: List[tf.Tensor]) -> List[tf.Tensor]:
        """Eager: this rank's mixed values at step ``step`` (collective)."""
        raise NotImplementedError

    def _average_all(self, values: List[tf.Tensor]) -> List[tf.Tensor]:
        """Eager: the mean of ``values`` over all ranks (collective)."""
        raise NotImplementedError

    # --- binding ----------------------------------------------------------------------

    # Plain Python at trace time: AutoGraph must not try to convert mpi4py's methods.
    @tf.autograph.experimental.do_not_convert
    def bind(self, variables: Sequence[tf.Variable], what: str,
             settings: Sequence[tuple] = ()) -> None:
        """The variables this state mixes; checked across ranks at the first call.

        Plain Python (mpi4py), so inside ``tf.function`` it runs at trace time, once:
        every rank traces its first step, whereas a later retrace may be one rank's only.
        ``settings``: more fingerprint entries for that first check (the positions of
        the variables a Keras optimizer keeps local).
        """
        variables = list(variables)
        strategy = type(self._sync).__name__
        if self._bound.variables is not None:
            if [v.ref() for v in variables] != [v.ref() for v in self._variables]:
                raise ValueError(f"hvdx {what}: this {strategy} object already mixes "
                                 f"{len(self._variables)} other variables; use one "
                                 f"hvdx.{strategy} object per model")
            return
        for i, v in enumerate(variables):
            if not isinstance(v, tf.Variable):
                raise ValueError(f"hvdx {what}: {strategy} mixes variables, but source "
                                 f"{i} is a {type(v).__name__}")
        fingerprint = Fingerprint.build(
            parameters=[(f"variable[{i}]", v.dtype.name, tuple(v.shape))
                        for i, v in enumerate(variables)],
            settings=list(self._bound.settings) + list(settings),
            labels=[v.name for v in variables])
        comm = communicator_for(_hvd.global_process_set, _hvd.global_process_set,
                                _hvd.size())
        check_consistent(fingerprint, comm, what)
        self._bound.variables = variables
        if self._sync.swa_start is not None:
            # Created outside any tf.function being traced (like Keras' slots), and
            # appended to the tracked list, so that a checkpoint read earlier restores
            # them now (its pending values wait on that list).
            with tf.init_scope():
                for i, v in enumerate(variables):
                    self.swa.append(tf.Variable(tf.zeros(v.shape, v.dtype),
                                                trainable=False, name=f"swa_{i}"))

    # --- one step -----------------------------------------------------------------------

    @tf.autograph.experimental.do_not_convert
    def average(self, extra: Sequence[tf.Variable] = ()) -> None:
        """Mix the variables (and ``extra``, the optimizer's slots), then add the result
        to the SWA running mean when due, then ``step += 1``; eagerly or in a graph.

        Whether the step is an SWA sample is the spec's decision
        (:meth:`hvdx.strategy.MixingStrategy.swa_due`), taken in the same eager
        ``py_function`` that mixes, which returns it as its last output."""
        variables = list(self._variables) + list(extra)
        step = self.step.read_value()
        *mixed, due = tf.py_function(
            self._mix_at_tensor, [step] + [v.read_value() for v in variables],
            [v.dtype for v in variables] + [tf.bool], name=f"hvdx_{self.name}")
        for v, value in zip(variables, mixed):
            if not tf.executing_eagerly():
                value.set_shape(v.shape)  # py_function outputs have unknown shapes
            v.assign(value)
        if self.swa:
            if not tf.executing_eagerly():
                due.set_shape([])
            count = self.swa_count.read_value()
            for mean, value in zip(self.swa, mixed):
                updated = running_mean(mean, tf.cast(count, mean.dtype), value)
                mean.assign(tf.where(due, updated, mean))
            self.swa_count.assign_add(tf.cast(due, tf.int64))
        self.step.assign_add(1)

    def _mix_at_tensor(self, step, *values):
        """Body of the ``tf.py_function``: eager, with this step's peers; the mixed
        values, then whether they are an SWA sample."""
        step = int(step.numpy())
        return list(self._mix_step(step, list(values))) + \
            [tf.constant(self._sync.swa_due(step))]

    def _mix_step(self, step: int, values: List[tf.Tensor]) -> List[tf.Tensor]:
        """Eager: step ``step``'s averaging. Decided here, once for every mixer: a
        ``global_every`` step averages over all ranks (:meth:`_average_everyone`), any
        other is the mixer's (:meth:`_mix_at`). DS-Sync overrides it: its groups
        answer all ranks at those steps themselves (the same
        :meth:`hvdx.strategy.MixingStrategy.global_due`)."""
        if self._global_due(step):
            return self._average_everyone(values)
        return self._mix_at(step, values)

    def _average_everyone(self, values: List[tf.Tensor]) -> List[tf.Tensor]:
        """Eager: a ``global_every`` step (a mixer may count its bytes here)."""
        return self._average_all(values)

    def synchronize_parameters(self, swa: bool = False, extra: Sequence[tf.Variable] = ()):
        """Average the variables over all ranks now (eager, collective); the schedule
        does not advance.

        Args:
            swa: first replace every rank's variables by its SWA running mean, so the
                result is the final SWA-style merge (mean over ranks and samples).
            extra: more variables to average (the Keras optimizer's slots).

        Raises:
            ValueError: before the first step, or ``swa=True`` before the first SWA
                sample, on every rank alike (every rank counts the same steps).
        """
        strategy = type(self._sync).__name__
        if self._bound.variables is None:
            raise ValueError(f"synchronize_parameters: no step taken yet, so {strategy} "
                             "does not know the variables")
        if swa:
            if int(self.swa_count.numpy()) == 0:
                raise ValueError(
                    "synchronize_parameters(swa=True): no SWA sample yet; set "
                    f"{strategy}(swa_start=...) and train past it (swa_start="
                    f"{self._sync.swa_start}, step {int(self.step.numpy())})")
            for v, mean in zip(self._variables, self.swa):
                v.assign(mean)
        variables = list(self._variables) + list(extra)
        averaged = self._average_all([v.read_value() for v in variables])
        for v, value in zip(variables, averaged):
            v.assign(value)

    def _global_due(self, step: int) -> bool:
        """Whether step ``step`` averages over all ranks (``global_every``)."""
        return self._sync.global_due(step)


class _Bound:
    """Holds the mixed variables (the model's) and the fingerprint settings out of the
    checkpoint's reach: a ``tf.Module`` would track them."""

    __slots__ = ("variables", "settings")

    def __init__(self):
        self.variables: Optional[List[tf.Variable]] = None
        self.settings: list = []


def average_over_all_ranks(values: List[tf.Tensor], name: str,
                           process_set=None) -> List[tf.Tensor]:
    """Eager: Horovod's grouped average of ``values`` over every rank (or the ranks of
    ``process_set``), one call per dtype, named ``<name>.<dtype>``."""
    if _hvd.size() == 1:
        return list(values)
    process_set = _hvd.global_process_set if process_set is None else process_set
    by_dtype: Dict[tf.DType, List[int]] = {}
    for i, v in enumerate(values):
        by_dtype.setdefault(v.dtype, []).append(i)
    out = list(values)
    for dtype, index in by_dtype.items():
        averaged = _hvd.grouped_allreduce([values[i] for i in index], op=_hvd.Average,
                                          process_set=process_set,
                                          name=f"{name}.{dtype.name}")
        for i, value in zip(index, averaged):
            out[i] = value
    return out


def new_state(cls, sync, plan, settings) -> MixingState:
    """``cls.from_plan(sync, plan)``, with ``settings`` (every setting the ranks compared
    when ``sync`` was resolved) kept for the check of its variables."""
    state = cls.from_plan(sync, plan)
    state._bound.settings = list(settings)
    return state


# A tape lives one step: its state is kept on the strategy object instead.
_TAPE_STATE = "_hvdx_tensorflow_state"


def tape_state(cls, sync, plan, settings) -> MixingState:
    """The state every tape given ``sync`` shares, made (:func:`new_state`) by the first
    tape, from the resolution the tapes share (:func:`hvdx.tensorflow.jobs.resolve_sync`)."""
    state = getattr(sync, _TAPE_STATE, None)
    if state is None:
        state = new_state(cls, sync, plan, settings)
        setattr(sync, _TAPE_STATE, state)
    return state


@tf.autograph.experimental.do_not_convert
def state_of(cls, sync) -> MixingState:
    """``hvd.dssync_state(sync)``, ``hvd.decentralized_state(sync)``: the state the
    tapes given ``sync`` keep (made at the first call, collective: every rank calls it,
    or builds its first tape, at the same point)."""
    if not isinstance(sync, cls.STRATEGY):
        raise ValueError(f"sync={sync!r} must be a hvdx.{cls.STRATEGY.__name__}")
    resolved = resolve_sync(sync, job(_hvd.Compression.none, _hvd.global_process_set),
                            "DistributedGradientTape", once=True)
    return tape_state(cls, sync, resolved.plan, resolved.settings)


# Often called while a tf.function is traced: AutoGraph must not convert (slowly, and
# uselessly: no tensor decides anything here) the registration and mpi4py code below.
@tf.autograph.experimental.do_not_convert
def mixing_tape(cls, gradtape, sync, plan, args):
    """``gradtape`` as a tape whose ``gradient`` mixes (:func:`make_mixing_tape`) with
    the state of ``cls`` for ``sync`` (``args``: :class:`hvdx.tensorflow.registry.
    GradientArguments`)."""
    state = tape_state(cls, sync, plan, args.checked_settings)
    cls.check_tape(sync)
    return make_mixing_tape(gradtape, state, cls.ATTRIBUTE, args.non_trainable_variables,
                            args.scale_local_gradients)


def mixing_keras_optimizer(cls, optimizer, sync, plan, args):
    """A Keras optimizer whose ``apply_gradients`` steps locally and mixes, in the
    order of ``cls.combines_first(sync)``, with Horovod's Keras optimizer API
    (:func:`make_mixing_keras_optimizer`). Horovod's aggregation arguments were
    compared across ranks with ``sync``, so a wrong value is refused on every rank.
    """
    what = "keras DistributedOptimizer"
    state = new_state(cls, sync, plan, args.checked_settings)
    passes = args.backward_passes_per_step
    if isinstance(passes, bool) or not isinstance(passes, numbers.Integral) or passes < 1:
        raise ValueError(
            f"hvdx {what}: backward_passes_per_step={passes!r} must be a whole number "
            f">= 1 with hvdx.{type(sync).__name__} (1: a local step and a mix every "
            "pass; N: the gradients of N passes summed locally, then one local step and "
            "one mix)")
    return make_mixing_keras_optimizer(
        optimizer, state, cls.ATTRIBUTE, combine_first=cls.combines_first(sync),
        extra=args.non_trainable_variables, backward_passes_per_step=int(passes),
        average_aggregated_gradients=args.average_aggregated_gradients,
        sparse_as_dense=args.sparse_as_dense,
        scale_local_gradients=args.scale_local_gradients)


def adapters(cls):
    """A mixing strategy's entries in :mod:`hvdx.tensorflow.registry` (the catalogue
    names them): ``(tape_adapter, keras_adapter)`` that put a tape or Keras optimizer
    mixing with the state class ``cls`` in place of Horovod's."""

    def tape_adapter(horovod, sync, plan, args, gradtape):
        return mixing_tape(cls, gradtape, sync, plan, args)

    def keras_adapter(horovod, sync, plan, args, optimizer):
        return mixing_keras_optimizer(cls, optimizer, sync, plan, args)

    tape_adapter.__doc__ = (f"``DistributedGradientTape``: a tape mixing with "
                            f"{cls.__name__} in place of Horovod's.")
    keras_adapter.__doc__ = (f"Keras' ``DistributedOptimizer``: an optimizer mixing with "
                             f"{cls.__name__} in place of Horovod's.")
    return tape_adapter, keras_adapter


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


# --- the tape ---------------------------------------------------------------------------

# Often called while a tf.function is traced: AutoGraph must not convert (slowly, and
# uselessly: no tensor decides anything here) the code below.
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
            grads, _scale_local(tf.nest.flatten(grads), flat, local, self._hvdx_scale_local))
    # The mix must not overtake the gradients (they are taken at x_t).
    ready = [g.values if isinstance(g, tf.IndexedSlices) else g
             for g in tf.nest.flatten(grads) if g is not None]
    with tf.control_dependencies(ready):
        state.average()
    return grads


# --- the Keras optimizer ----------------------------------------------------------------

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


def _scale_local(grads, variables, local, scale: bool):
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
        scaled as Horovod scales them (:func:`_scale_local`). Sends nothing."""
        object.__setattr__(self, "_aggregated_gradients", True)
        if self._agg_helper is not None:
            return self._agg_helper.compute_gradients(tuple(grads), tuple(variables))
        return _scale_local(grads, variables, self._local_vars, self.scale_local_gradients)

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


def tape_counters(tape, variables):
    """The counters of DS-Sync's and the graphs' tapes (for the step log, through
    :mod:`hvdx.tensorflow.registry`): the state the tape mixes with."""
    return getattr(getattr(tape, "_hvdx_state", None), "hvdx_stats", None)
