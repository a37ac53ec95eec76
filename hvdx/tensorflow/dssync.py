"""DS-Sync for TensorFlow: group averaging of the variables through Horovod process sets.

DS-Sync (Wang et al., "Divide-and-Shuffle Synchronization for Distributed Machine
Learning", arXiv 2007.03298); the numpy reference is
:func:`hvdx.core.group_averaging.simulate_dssync`. Two entry points:

``hvd.DistributedOptimizer(opt, sync=hvdx.DSSync(...))`` (Keras, "adapt-then-combine",
as torch): ``apply_gradients`` at step ``t`` on every rank

1. applies the LOCAL gradients with the user's optimizer (no gradient communication);
2. averages the variables (with ``average_optimizer_state``, also the optimizer's slot
   variables of the same shapes) over this rank's group of ``partition(t)``; every
   ``global_every``-th step over all ranks;
3. with ``swa_start``, adds the averaged variables to the SWA running mean;
4. ``t += 1``.

``hvd.DistributedGradientTape(tape, sync=hvdx.DSSync(...))`` ("combine-then-adapt"):
the tape cannot see the optimizer's step, so ``gradient()`` returns the LOCAL gradients
``g(x_t)`` and, once they are computed, replaces the variables by their group average
(steps 2-4 above). The optimizer then applies ``g(x_t)`` to the averaged variables:
``x_{t+1} = avg_group(x_t) - lr * g(x_t)``, the update of D-PSGD (Lian et al., arXiv
1705.09056), which the reference runs with ``order=COMBINE_THEN_ADAPT``. Its state (step,
SWA means, byte counters) belongs to the ``DSSync`` object, because a script builds a
new tape every step: create one ``DSSync`` object per model, once, outside the step
(a new object starts again at step 0), and use :func:`dssync_state` to checkpoint it or
to call ``synchronize_parameters``. Every ``gradient()`` call is one DS-Sync step.

How one average runs, eagerly, inside ``tf.function`` and in Keras ``fit`` alike:
Horovod's TensorFlow ops take their process set when they are built, but the group
changes every step, so the step's values go through one ``tf.py_function`` that picks
the group from the step variable and calls Horovod's eager
``grouped_allreduce(op=Average, process_set=...)`` (one call per dtype); the graph then
assigns the results. Every rank runs the same steps in the same order, so every rank
calls the same collectives. Process sets: :class:`hvdx.mpi.dssync_groups.DSSyncGroups`
(shared with torch); registration needs ``hvd.init(process_sets="dynamic")``, or the
sets of :func:`dssync_process_sets` passed to ``hvd.init``.
"""

from __future__ import annotations

import json
from typing import Dict, List, Optional, Sequence

import horovod.tensorflow as _hvd
import tensorflow as tf

from hvdx.core.fingerprint import Fingerprint
from hvdx.dssync import DSSync
from hvdx.mpi import check_consistent, communicator_for
from hvdx.mpi.dssync_groups import DSSyncGroups, static_groups
from hvdx.settings import horovod_settings
from hvdx.strategy import resolve
from hvdx.tensorflow.jobs import job

__all__ = ["DSSyncState", "dssync_process_sets", "dssync_state",
           "make_dssync_keras_optimizer", "make_dssync_tape"]

# The tape's state is kept on the DSSync object (the tape itself is rebuilt every step).
_TAPE_STATE = "_hvdx_tensorflow_state"
# Run-time tape classes, one per user tape class.
_TAPE_CLASSES: Dict[type, type] = {}


def dssync_process_sets(sync: DSSync, size: int) -> List[_hvd.ProcessSet]:
    """The process sets to pass to ``hvd.init(process_sets=...)`` for static mode.

    See :func:`hvdx.mpi.dssync_groups.static_groups` (``ValueError`` for a shuffle).
    """
    return [_hvd.ProcessSet(list(g)) for g in static_groups(sync, size)]


class DSSyncState(tf.Module):
    """The DS-Sync state of one model: schedule step, SWA running mean, byte counters.

    A ``tf.Module``: put it in a ``tf.train.Checkpoint`` (the Keras optimizer tracks
    its own), and a restored run continues the same schedule (with ``probe_every``,
    on the rotation rebuilt from the probe, kept in ``adapted``).

    Attributes:
        step: ``tf.Variable`` (int64), steps taken: the schedule's position.
        swa_count: ``tf.Variable`` (int64), samples in the SWA running mean.
        swa: the SWA running means, one variable per averaged variable (empty until the
            first step binds the variables).
        hvdx_stats: :class:`hvdx.mpi.dssync_groups.DSSyncStats`, bytes sent.
    """

    def __init__(self, sync: DSSync, schedule):
        super().__init__(name="hvdx_dssync")
        self._groups = DSSyncGroups(sync, schedule, _hvd)  # collective: registers sets
        self._sync = sync
        self.hvdx_stats = self._groups.stats
        # Built eagerly even when the first tape is made while a tf.function is traced.
        with tf.init_scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            self.swa_count = tf.Variable(0, dtype=tf.int64, trainable=False,
                                         name="swa_count")
            if self._groups.adaptation is not None:
                # DSSync(probe_every=K): the rebuilt rotation (JSON, "" until one).
                self.adapted = tf.Variable("", dtype=tf.string, trainable=False,
                                           name="adapted")
        self.swa: List[tf.Variable] = []
        self._bound = _Bound()

    @property
    def schedule(self):
        return self._groups.schedule

    @property
    def _variables(self) -> List[tf.Variable]:
        return self._bound.variables

    # --- binding ------------------------------------------------------------------------

    # Plain Python at trace time: AutoGraph must not try to convert mpi4py's methods.
    @tf.autograph.experimental.do_not_convert
    def bind(self, variables: Sequence[tf.Variable], what: str) -> None:
        """The variables this state averages; checked across ranks at the first call.

        Plain Python (mpi4py), so inside ``tf.function`` it runs at trace time, once:
        every rank traces its first step, whereas a later retrace may be one rank's only.
        """
        variables = list(variables)
        if self._bound.variables is not None:
            if [v.ref() for v in variables] != [v.ref() for v in self._variables]:
                raise ValueError(f"hvdx {what}: this DSSync object already averages "
                                 f"{len(self._variables)} other variables; use one "
                                 "hvdx.DSSync object per model")
            return
        for i, v in enumerate(variables):
            if not isinstance(v, tf.Variable):
                raise ValueError(f"hvdx {what}: DS-Sync averages variables, but source "
                                 f"{i} is a {type(v).__name__}")
        fingerprint = Fingerprint.build(
            parameters=[(f"variable[{i}]", v.dtype.name, tuple(v.shape))
                        for i, v in enumerate(variables)],
            settings=self._bound.settings, labels=[v.name for v in variables])
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

    # --- averaging ----------------------------------------------------------------------

    @tf.autograph.experimental.do_not_convert
    def average(self, extra: Sequence[tf.Variable] = ()) -> None:
        """Steps 2-4 of the module docstring, eagerly or inside a ``tf.function``."""
        variables = list(self._variables) + list(extra)
        step = self.step.read_value()
        averaged = tf.py_function(self._exchange_at, [step] + [v.read_value()
                                                               for v in variables],
                                  [v.dtype for v in variables], name="hvdx_dssync")
        for v, value in zip(variables, averaged):
            if not tf.executing_eagerly():
                value.set_shape(v.shape)  # py_function outputs have unknown shapes
            v.assign(value)
        if self.swa:
            start, every = self._sync.swa_start, self._sync.swa_every
            due = tf.logical_and(step >= start, (step - start) % every == 0)
            count = self.swa_count.read_value()
            for mean, value in zip(self.swa, averaged):
                # The reference's running mean: mean + (sample - mean) / (count + 1).
                updated = mean + (value - mean) / tf.cast(count + 1, mean.dtype)
                mean.assign(tf.where(due, updated, mean))
            self.swa_count.assign_add(tf.cast(due, tf.int64))
        self.step.assign_add(1)

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
        if self._bound.variables is None:
            raise ValueError("synchronize_parameters: no step taken yet, so DS-Sync does "
                             "not know the variables")
        if swa:
            if int(self.swa_count.numpy()) == 0:
                raise ValueError(
                    "synchronize_parameters(swa=True): no SWA sample yet; set "
                    f"DSSync(swa_start=...) and train past it (swa_start="
                    f"{self._sync.swa_start}, step {int(self.step.numpy())})")
            for v, mean in zip(self._variables, self.swa):
                v.assign(mean)
        variables = list(self._variables) + list(extra)
        averaged = self._exchange(self._groups.all_ranks,
                                  [v.read_value() for v in variables])
        for v, value in zip(variables, averaged):
            v.assign(value)

    def _exchange_at(self, step, *values):
        """Body of the ``tf.py_function``: runs eagerly, with this step's process set."""
        step = int(step.numpy())
        if self._groups.adaptation is None:
            return self._exchange(self._groups.group_at(step), list(values))
        self._load_adaptation(step)
        group = self._groups.group_at(step)  # may probe and rebuild the rotation
        state = self._groups.adaptation.state()
        saved = "" if state is None else json.dumps(state, sort_keys=True, default=int)
        if saved != self._bound.adapted:
            self.adapted.assign(saved)
            self._bound.adapted = saved
        return self._exchange(group, list(values))

    def _load_adaptation(self, step: int) -> None:
        """A checkpoint restored ``adapted``: continue on that rotation (collective: it
        registers process sets, and every rank restores the same checkpoint)."""
        saved = self.adapted.numpy().decode()
        if saved and saved != self._bound.adapted:
            self._groups.load_state({"step": step, "adapted": json.loads(saved)})
        self._bound.adapted = saved

    def _exchange(self, group, values: List[tf.Tensor]) -> List[tf.Tensor]:
        groups = self._groups
        groups.record(group, sum(int(v.shape.num_elements()) * v.dtype.size for v in values))
        if len(group) < 2:
            return values
        process_set = groups.process_set(group)
        by_dtype: Dict[tf.DType, List[int]] = {}
        for i, v in enumerate(values):
            by_dtype.setdefault(v.dtype, []).append(i)
        out = list(values)
        for dtype, index in by_dtype.items():
            averaged = _hvd.grouped_allreduce(
                [values[i] for i in index], op=_hvd.Average, process_set=process_set,
                name=groups.tensor_name(group, dtype.name))
            for i, value in zip(index, averaged):
                out[i] = value
        return out


class _Bound:
    """Holds the averaged variables (the model's) and the fingerprint settings out of the
    checkpoint's reach: a ``tf.Module`` would track them."""

    __slots__ = ("variables", "settings", "adapted")

    def __init__(self):
        self.variables: Optional[List[tf.Variable]] = None
        self.settings: list = []
        self.adapted = ""  # the JSON in ``DSSyncState.adapted`` as last read or written


def _new_state(sync: DSSync, compression, process_set, what: str) -> DSSyncState:
    """Resolve ``sync`` and check it across ranks (collective); raise on every rank."""
    resolved = resolve(sync, job(compression, process_set))
    settings = horovod_settings(sync=sync) + resolved.settings
    comm = communicator_for(_hvd.global_process_set, _hvd.global_process_set, _hvd.size())
    check_consistent(Fingerprint.build(parameters=[], settings=settings), comm, what)
    resolved.raise_error()
    state = DSSyncState(sync, resolved.plan.schedule)
    state._bound.settings = settings
    return state


@tf.autograph.experimental.do_not_convert
def dssync_state(sync: DSSync) -> DSSyncState:
    """The state ``DistributedGradientTape(tape, sync=sync)`` keeps for ``sync``.

    Created at the first call (collective: every rank calls it, or builds its first
    tape, at the same point). Put it in a ``tf.train.Checkpoint`` to resume the same
    schedule; ``dssync_state(sync).synchronize_parameters()`` averages over all ranks.
    """
    if not isinstance(sync, DSSync):
        raise ValueError(f"sync={sync!r} must be a hvdx.DSSync")
    return _tape_state(sync, _hvd.Compression.none, _hvd.global_process_set)


def _tape_state(sync: DSSync, compression, process_set) -> DSSyncState:
    state = getattr(sync, _TAPE_STATE, None)
    if state is None:
        state = _new_state(sync, compression, process_set, "DistributedGradientTape")
        setattr(sync, _TAPE_STATE, state)
    elif compression is not _hvd.Compression.none or \
            process_set is not _hvd.global_process_set:
        # Built before: the collective checks ran then; these arguments are this call's.
        raise ValueError("compression and process_set: DS-Sync sends no gradients and "
                         "chooses its own groups; leave compression=Compression.none and "
                         "process_set=hvd.global_process_set")
    return state


# --- the tape ---------------------------------------------------------------------------

# Often called while a tf.function is traced: AutoGraph must not convert (slowly, and
# uselessly: no tensor decides anything here) the registration and mpi4py code below.
@tf.autograph.experimental.do_not_convert
def make_dssync_tape(gradtape, sync: DSSync, compression, process_set):
    """``gradtape`` as an instance of a run-time subclass whose ``gradient`` averages.

    ``isinstance(result, type(gradtape))`` holds; the recorded operations are shared.
    """
    state = _tape_state(sync, compression, process_set)
    base = gradtape.__class__
    if base not in _TAPE_CLASSES:
        _TAPE_CLASSES[base] = type(base.__name__, (base,), {
            "gradient": _tape_gradient, "_hvdx_base": base,
            "hvdx_dssync": property(lambda self: self._hvdx_state)})
    tape = _TAPE_CLASSES[base].__new__(_TAPE_CLASSES[base])
    # Share the recorded tape and its flags (Horovod's own wrapper shares ``_tape`` too).
    tape.__dict__.update(gradtape.__dict__)
    tape._hvdx_state = state
    return tape


@tf.autograph.experimental.do_not_convert
def _tape_gradient(self, target, sources, output_gradients=None, *args, **kwargs):
    """Local gradients; then the sources are replaced by their group average."""
    grads = self._hvdx_base.gradient(self, target, sources, output_gradients, *args,
                                     **kwargs)
    state = self._hvdx_state
    state.bind(tf.nest.flatten(sources), "DistributedGradientTape")
    # The average must not overtake the gradients (they are taken at x_t).
    ready = [g.values if isinstance(g, tf.IndexedSlices) else g
             for g in tf.nest.flatten(grads) if g is not None]
    with tf.control_dependencies(ready):
        state.average()
    return grads


# --- the Keras optimizer ----------------------------------------------------------------

def make_dssync_keras_optimizer(optimizer, sync: DSSync, compression, process_set):
    """A Keras optimizer of a run-time subclass of ``optimizer``'s class, rebuilt from its
    config as Horovod rebuilds it, whose ``apply_gradients`` also averages (collective).
    """
    state = _new_state(sync, compression, process_set, "keras DistributedOptimizer")
    base = optimizer.__class__
    namespace = {name: value for name, value in _KerasDSSync.__dict__.items()
                 if not name.startswith("__")}
    namespace["_hvdx_base"] = base
    cls = type(base.__name__, (base,), namespace)
    opt = cls.from_config(optimizer.get_config())
    opt.hvdx_dssync = state
    return opt


class _KerasDSSync:
    """Members copied into the run-time optimizer class; ``_hvdx_base`` is the user's."""

    @property
    def hvdx_stats(self):
        return self.hvdx_dssync.hvdx_stats

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        """Local step, then averaging in this rank's group (module docstring)."""
        grads_and_vars = list(grads_and_vars)
        result = self._hvdx_base.apply_gradients(self, grads_and_vars, *args, **kwargs)
        state = self.hvdx_dssync
        state.bind([v for _, v in grads_and_vars], "keras DistributedOptimizer")
        state.average(self._hvdx_slots())
        return result

    def synchronize_parameters(self, swa: bool = False):
        """Average the variables (and slots, if configured) over all ranks now.

        See :meth:`DSSyncState.synchronize_parameters`.
        """
        self.hvdx_dssync.synchronize_parameters(swa=swa, extra=self._hvdx_slots())

    def _hvdx_slots(self) -> List[tf.Variable]:
        """With ``average_optimizer_state``: the optimizer's variables shaped like a
        trained one (momenta, Adam moments), in the optimizer's order (the same on every
        rank); never the iteration count, nor scalars (learning rate)."""
        state = self.hvdx_dssync
        if not state._sync.average_optimizer_state:
            return []
        variables = self.variables() if callable(self.variables) else self.variables
        shapes = {tuple(v.shape) for v in state._variables}
        return [v for v in variables
                if v is not self.iterations and v.dtype.is_floating and v.shape.rank
                and tuple(v.shape) in shapes]
