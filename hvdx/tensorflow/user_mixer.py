"""A registered mixer (:mod:`hvdx.mixer_registry`) for TensorFlow.

The step counter, ``global_every``, the SWA merge, ``synchronize_parameters``, the tape
and the Keras optimizer are the parameter-mixing strategies' shared part
(:mod:`hvdx.tensorflow.mixing`); this module is the mixer, :class:`MixerState`: inside
the step's ``tf.py_function`` it hands the variables' values to the user's mixer as
numpy arrays and returns its result. The mixer's own :meth:`hvdx.Mixer.state` is kept,
as JSON, in the string variable ``mixer_state``, so a ``tf.train.Checkpoint`` of the
state holds it beside the step.

Entry points and orders, as for ``hvdx.Decentralized``: the Keras optimizer steps
locally, then mixes (adapt-then-combine); ``DistributedGradientTape`` returns the
gradients before the optimizer applies them, so it mixes ``x_t`` first and the
optimizer then applies the gradients taken at ``x_t`` (combine-then-adapt). A script
builds a tape every step: the state belongs to the spec object (one per model), and
:func:`mixer_state` gives it (checkpoint, ``synchronize_parameters``).
"""

from __future__ import annotations

import json
from typing import List

import horovod.tensorflow as _hvd
import tensorflow as tf

from hvdx.core.counters import MixingStats
from hvdx.mixer_registry import UserMixing
from hvdx.mpi.comm import world
from hvdx.mpi.user_mixer_exchange import Peers
from hvdx.tensorflow.mixing import (MixingState, adapters, average_over_all_ranks,
                                    state_of)

__all__ = ["MixerState", "keras_adapter", "mixer_state", "tape_adapter"]


class MixerState(MixingState):
    """One model's state under a registered mixer: step, SWA running means, the
    mixer's own state (``mixer_state``, JSON), byte counters (``hvdx_stats``)."""

    STRATEGY = UserMixing
    ATTRIBUTE = "hvdx_mixer"

    @classmethod
    def from_plan(cls, sync: UserMixing, plan) -> "MixerState":
        return cls(sync)

    def __init__(self, sync: UserMixing):
        super().__init__(sync, name="hvdx_mixer")
        self.hvdx_stats = MixingStats()
        self._peers = Peers(world(_hvd.global_process_set), self.hvdx_stats)
        self._peers._what = f"{type(sync.mixer).__qualname__}.matrix"
        self._seen = ""  # the JSON in ``mixer_state`` as last seen (a str: untracked)
        with tf.init_scope():
            self.mixer_state = tf.Variable("", dtype=tf.string, trainable=False,
                                           name="mixer_state")

    # --- the mixer ----------------------------------------------------------------------

    def _mix_at(self, step: int, values: List[tf.Tensor]) -> List[tf.Tensor]:
        mixer = self._sync.mixer
        saved = self.mixer_state.numpy().decode()
        if saved != self._seen:  # restored from a checkpoint
            mixer.load_state(json.loads(saved) if saved else {})
        arrays = [v.numpy() for v in values]
        out = [tf.convert_to_tensor(value.astype(a.dtype, copy=False)) for a, value in
               zip(arrays, self._sync.mixed(step, arrays, self._peers))]
        state = mixer.state()
        text = json.dumps(state, sort_keys=True) if state else ""
        if text != saved:
            self.mixer_state.assign(text)
        self._seen = text
        return out

    def _average_all(self, values: List[tf.Tensor]) -> List[tf.Tensor]:
        return average_over_all_ranks(values, f"hvdx.{self._sync.name}.all")

    def _average_everyone(self, values: List[tf.Tensor]) -> List[tf.Tensor]:
        nbytes = sum(int(v.shape.num_elements()) * v.dtype.size for v in values)
        self.hvdx_stats.add_everyone(nbytes, self._peers.size)
        return self._average_all(values)


@tf.autograph.experimental.do_not_convert
def mixer_state(sync: UserMixing) -> MixerState:
    """The state ``DistributedGradientTape(tape, sync=sync)`` keeps for ``sync`` (made at
    the first call, collective: every rank calls it, or builds its first tape, at the
    same point). Put it in a ``tf.train.Checkpoint``; ``mixer_state(sync)
    .synchronize_parameters()`` averages over all ranks."""
    return state_of(MixerState, sync)


# --- a registered mixer's entries in hvdx.tensorflow.registry (the catalogue names them) -

#: A mixing tape or Keras optimizer in place of Horovod's
#: (:func:`hvdx.tensorflow.mixing.adapters`).
tape_adapter, keras_adapter = adapters(MixerState)
