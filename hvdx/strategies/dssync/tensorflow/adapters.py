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

The step, the SWA merge, the tape and the Keras optimizer are the parameter-mixing
strategies' shared part (:mod:`hvdx.tensorflow.mixing`); this module is DS-Sync's mixer.
How one average runs, eagerly, inside ``tf.function`` and in Keras ``fit`` alike:
Horovod's TensorFlow ops take their process set when they are built, but the group
changes every step, so the step's values go through one ``tf.py_function`` that picks
the group from the step variable and calls Horovod's eager
``grouped_allreduce(op=Average, process_set=...)`` (one call per dtype); the graph then
assigns the results. Every rank runs the same steps in the same order, so every rank
calls the same collectives. Process sets: :class:`hvdx.strategies.dssync.mpi_groups.DSSyncGroups`
(shared with torch); registration needs ``hvd.init(process_sets="dynamic")``, or the
sets of :func:`dssync_process_sets` passed to ``hvd.init``.
"""

from __future__ import annotations

import json
from typing import List

import horovod.tensorflow as _hvd
import tensorflow as tf

from hvdx.strategies.dssync.mpi_groups import DSSyncGroups, static_groups
from hvdx.strategies.dssync.spec import DSSync
from hvdx.tensorflow.mixing import (MixingState, adapters, average_over_all_ranks,
                                    state_of)

__all__ = ["DSSyncState", "dssync_process_sets", "dssync_state", "keras_adapter",
           "tape_adapter"]

def dssync_process_sets(sync: DSSync, size: int) -> List[_hvd.ProcessSet]:
    """The process sets to pass to ``hvd.init(process_sets=...)`` for static mode.

    See :func:`hvdx.strategies.dssync.mpi_groups.static_groups` (``ValueError`` for a shuffle).
    """
    return [_hvd.ProcessSet(list(g)) for g in static_groups(sync, size)]


class DSSyncState(MixingState):
    """The DS-Sync state of one model: schedule step, SWA running mean, byte counters.

    A ``tf.Module`` (:class:`hvdx.tensorflow.mixing.MixingState`): put it in a
    ``tf.train.Checkpoint`` (the Keras optimizer tracks its own), and a restored run
    continues the same schedule (with ``probe_every``, on the rotation rebuilt from the
    probe, kept in ``adapted``).

    Attributes:
        step, swa_count, swa: see :class:`~hvdx.tensorflow.mixing.MixingState`.
        hvdx_stats: :class:`hvdx.strategies.dssync.mpi_groups.DSSyncStats`, bytes sent.
    """

    STRATEGY = DSSync
    ATTRIBUTE = "hvdx_dssync"

    @classmethod
    def from_plan(cls, sync: DSSync, plan) -> "DSSyncState":
        return cls(sync, plan.schedule)

    def __init__(self, sync: DSSync, schedule):
        self._groups = DSSyncGroups(sync, schedule, _hvd)  # collective: registers sets
        super().__init__(sync, name="hvdx_dssync")
        self.hvdx_stats = self._groups.stats
        self._adapted_seen = ""  # the JSON in ``adapted`` as last seen (a str: untracked)
        if self._groups.adaptation is not None:
            with tf.init_scope():
                # DSSync(probe_every=K): the rebuilt rotation (JSON, "" until one).
                self.adapted = tf.Variable("", dtype=tf.string, trainable=False,
                                           name="adapted")

    @property
    def schedule(self):
        return self._groups.schedule

    # --- the mixer ----------------------------------------------------------------------

    def _mix_step(self, step: int, values):
        # The groups answer all ranks at the global_every steps (group_at), and may
        # probe or register process sets there: every step goes to them.
        return self._mix_at(step, values)

    def _mix_at(self, step: int, values):
        """This step's process set (``global_every``: all ranks), eagerly."""
        if self._groups.adaptation is None:
            return self._exchange(self._groups.group_at(step), values)
        self._load_adaptation(step)
        group = self._groups.group_at(step)  # may probe and rebuild the rotation
        state = self._groups.adaptation.state()
        saved = "" if state is None else json.dumps(state, sort_keys=True, default=int)
        if saved != self._adapted_seen:
            self.adapted.assign(saved)
            self._adapted_seen = saved
        return self._exchange(group, values)

    def _average_all(self, values):
        return self._exchange(self._groups.all_ranks, values)

    def _load_adaptation(self, step: int) -> None:
        """A checkpoint restored ``adapted``: continue on that rotation (collective: it
        registers process sets, and every rank restores the same checkpoint)."""
        saved = self.adapted.numpy().decode()
        if saved and saved != self._adapted_seen:
            self._groups.load_state({"step": step, "adapted": json.loads(saved)})
        self._adapted_seen = saved

    def _exchange(self, group, values: List[tf.Tensor]) -> List[tf.Tensor]:
        groups = self._groups
        groups.record(group, sum(int(v.shape.num_elements()) * v.dtype.size for v in values))
        if len(group) < 2:
            return values
        return average_over_all_ranks(values, groups.tensor_prefix(group),
                                      groups.process_set(group))



@tf.autograph.experimental.do_not_convert
def dssync_state(sync: DSSync) -> DSSyncState:
    """The state ``DistributedGradientTape(tape, sync=sync)`` keeps for ``sync``.

    Created at the first call (collective: every rank calls it, or builds its first
    tape, at the same point). Put it in a ``tf.train.Checkpoint`` to resume the same
    schedule; ``dssync_state(sync).synchronize_parameters()`` averages over all ranks.
    """
    return state_of(DSSyncState, sync)


# --- DS-Sync's entries in hvdx.tensorflow.registry (the catalogue names them) ------------

#: A DS-Sync tape or Keras optimizer in place of Horovod's: a local step, then the
#: step's group average (:func:`hvdx.tensorflow.mixing.adapters`).
tape_adapter, keras_adapter = adapters(DSSyncState)
