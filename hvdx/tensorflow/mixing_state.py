"""The parameter-mixing strategies' TensorFlow driver: one state class for every mixer.

DS-Sync, decentralized SGD and a user's registered mixer send no gradients: every rank
steps locally and then averages its variables with other ranks. Each is a
framework-neutral :class:`hvdx.core.mixer_protocol.Mixer`; :class:`MixingState` (a
``tf.Module``, so it checkpoints) runs any of them:

1. the step counter, the SWA running means, the variables it mixes (checked across
   ranks when first seen: :meth:`MixingState.bind`), the mixer's own state (JSON in the
   string variable ``mixer_state``), ``synchronize_parameters()`` and
   ``consensus_distance()``;
2. one mixing step (:meth:`MixingState.average`), eagerly, inside ``tf.function`` and in
   Keras ``fit`` alike: the values go through one ``tf.py_function`` whose body (eager
   Python) asks the mixer for the step's exchange (``mixer.exchange(step, everyone)``)
   and runs it:

   - ``Everyone`` / ``Group``: Horovod's eager ``grouped_allreduce(op=Average)`` over
     all ranks or the group's process set, one call per dtype (Horovod's TensorFlow ops
     take their process set when they are built, but DS-Sync's group changes every
     step, hence the ``py_function``);
   - ``Neighbours``: ONE contiguous buffer per dtype family
     (:mod:`hvdx.core.fused_layout`), exchanged with the step's neighbours by mpi4py
     non-blocking point-to-point on hvdx's duplicated communicator
     (:mod:`hvdx.mpi.neighbor_exchange`), ``w_ii x_i + sum_j w_ij x_j`` in the
     buffer's dtype, sources in rank order. Unlike PyTorch's combine-then-adapt, it
     completes inside the step that starts it (a ``tf.py_function`` cannot leave MPI
     requests in flight across graph executions safely);
   - ``Custom``: the mixer's ``mix`` on the numpy values; ``Skip``: nothing;

   the graph then assigns the results. Every rank runs the same steps in the same
   order, so every rank joins the same communication.

The tape (:mod:`hvdx.tensorflow.mixing_tape`) and the Keras optimizer
(:mod:`hvdx.tensorflow.mixing_keras`) hold one; a script builds a tape every step, so
the tapes' state belongs to the spec object (:func:`state_of`).
"""

from __future__ import annotations

import json
from typing import Dict, List, Optional, Sequence

import horovod.tensorflow as _hvd
import numpy as np
import tensorflow as tf

from hvdx.core.counters import MixingStats
from hvdx.core.fingerprint import Fingerprint
from hvdx.core.group_averaging import running_mean
from hvdx.core.mixer_protocol import (Custom, Everyone, Group, Neighbours, Skip,
                                      mixed_arrays)
from hvdx.mpi import check_consistent, communicator_for
from hvdx.mpi.comm import world
from hvdx.mpi.neighbor_exchange import FusedExchange, consensus_distance
from hvdx.mpi.user_mixer_exchange import Peers
from hvdx.strategies import catalogue
from hvdx.strategy_contract import MixingStrategy
from hvdx.tensorflow.jobs import job, resolve_sync

__all__ = ["MixingState", "STATE_GETTERS", "average_over_all_ranks", "new_state", "state_of",
           "tape_state"]

#: MPI tags of the fused buffers, per family: hvdx's communicator only (torch's are
#: 0x4876 and 0x4877; one framework runs per process, but distinct tags cost nothing).
_TAGS = {np.dtype(np.float32): 0x4878, np.dtype(np.float64): 0x4879}


class MixingState(tf.Module):
    """One model's mixing state under any mixer (module docstring).

    A ``tf.Module``: put it in a ``tf.train.Checkpoint`` (the Keras optimizer tracks its
    own), and a restored run continues the same schedule. It also shows the mixer's
    :attr:`~hvdx.core.mixer_protocol.Mixer.views` (DS-Sync's ``schedule``, the graph's
    ``graph``).

    Attributes:
        step: ``tf.Variable`` (int64), steps taken: the schedule's position.
        swa_count: ``tf.Variable`` (int64), samples in the SWA running mean.
        swa: the SWA running means, one variable per mixed variable (empty until the
            first step binds the variables).
        mixer_state: ``tf.Variable`` (string), the mixer's own state as JSON ("" for
            none): DS-Sync's rotation rebuilt from its probe, a user's mixer's state.
        hvdx_stats: the mixer's byte counters.
    """

    def __init__(self, sync, mixer):
        mixer.bind(_hvd)  # collective where the mixer registers process sets
        super().__init__(name=sync.state_key)
        self._sync = sync
        self._mixer = mixer
        if mixer.stats is None:
            mixer.stats = MixingStats()
        self.hvdx_stats = mixer.stats
        self._comm = world(_hvd.global_process_set)
        self._size = self._comm.Get_size()
        self._exchange = FusedExchange(self._comm, _TAGS)
        self._peers: Optional[Peers] = None
        self._seen = ""  # the JSON in ``mixer_state`` as last seen (a str: untracked)
        # Built eagerly even when the first tape is made while a tf.function is traced.
        with tf.init_scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            self.swa_count = tf.Variable(0, dtype=tf.int64, trainable=False,
                                         name="swa_count")
            self.mixer_state = tf.Variable("", dtype=tf.string, trainable=False,
                                           name="mixer_state")
        self.swa: List[tf.Variable] = []
        self._bound = _Bound()

    def __getattr__(self, name):
        # The mixer's views (only reached when ordinary lookup fails).
        mixer = self.__dict__.get("_mixer")
        views = type(mixer).views if mixer is not None else {}
        if name in views:
            return getattr(mixer, views[name])
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def _variables(self) -> List[tf.Variable]:
        return self._bound.variables

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
        (:meth:`hvdx.strategy_contract.MixingStrategy.swa_due`), taken in the same eager
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
        """Eager: step ``step``'s exchange, as the mixer asks for it (``everyone``: a
        ``global_every`` step), with the mixer's state kept in ``mixer_state``."""
        mixer = self._mixer
        saved = self.mixer_state.numpy().decode()
        if saved != self._seen:  # restored from a checkpoint
            mixer.load_state(json.loads(saved) if saved else {})
        out = self._run(mixer.exchange(step, self._sync.global_due(step)), step, values)
        state = mixer.state()
        text = json.dumps(state, sort_keys=True, default=int) if state else ""
        if text != saved:
            self.mixer_state.assign(text)
        self._seen = text
        return out

    def _run(self, exchange, step: int, values: List[tf.Tensor]) -> List[tf.Tensor]:
        """Eager: one exchange of the values (module docstring)."""
        nbytes = sum(int(v.shape.num_elements()) * v.dtype.size for v in values)
        mixer = self._mixer
        if isinstance(exchange, Everyone):
            mixer.count(exchange, nbytes, self._size)
            return average_over_all_ranks(values, f"hvdx.{self._sync.name}.all")
        if isinstance(exchange, Group):
            mixer.count(exchange, nbytes, self._size)
            if len(exchange.ranks) < 2:
                return values
            return average_over_all_ranks(values, exchange.name, exchange.process_set)
        if isinstance(exchange, Neighbours):
            return self._neighbours(exchange, values, nbytes)
        if isinstance(exchange, Custom):
            if self._peers is None:
                self._peers = Peers(self._comm, self.hvdx_stats)
                self._peers._what = f"{type(mixer).__qualname__}.matrix"
            arrays = [v.numpy() for v in values]
            return [tf.convert_to_tensor(value.astype(a.dtype, copy=False)) for a, value
                    in zip(arrays, mixed_arrays(mixer, step, arrays, self._peers))]
        if isinstance(exchange, Skip):
            mixer.count(exchange, 0, self._size)
            return values
        raise TypeError(f"{type(mixer).__qualname__}.exchange(step={step}) returned "
                        f"{exchange!r}, not an exchange of hvdx.core.mixer_protocol")

    def _neighbours(self, exchange: Neighbours, values, nbytes: int) -> List[tf.Tensor]:
        arrays = [v.numpy() for v in values]
        # The layout is built at the first step, rebuilt if the variables change (slots
        # joining the mix); every family is posted before any is waited for.
        fused = self._exchange
        layout = fused.layout_for((a.dtype.name, a.size) for a in arrays)
        layout.pack(arrays, out=fused.buffers)
        neighbours = exchange.neighbours
        fused.start(neighbours.send_to, neighbours.recv_from)
        traffic = fused.finish(neighbours.self_weight, neighbours.recv_weights)
        self._mixer.count(exchange, nbytes, self._size, traffic)
        return [tf.convert_to_tensor(a) for a in layout.unpack(fused.mixed, arrays)]

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
        averaged = average_over_all_ranks([v.read_value() for v in variables],
                                          f"hvdx.{self._sync.name}.all")
        for v, value in zip(variables, averaged):
            v.assign(value)

    def consensus_distance(self) -> float:
        """``sqrt(mean_i ||x_i - mean_j x_j||^2)`` over the mixed variables (eager,
        collective, float64): how far the ranks' models are apart."""
        if self._bound.variables is None:
            raise ValueError(f"consensus_distance: no step taken yet, so "
                             f"{type(self._sync).__name__} does not know the variables")
        x = np.concatenate([np.asarray(v.numpy(), dtype=np.float64).reshape(-1)
                            for v in self._variables] or [np.zeros(0)])
        return consensus_distance(self._comm, x)


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


def new_state(sync, setup, settings) -> MixingState:
    """The state of ``sync``'s mixer for ``setup``, with ``settings`` (every setting the
    ranks compared when ``sync`` was resolved) kept for the check of its variables."""
    state = MixingState(sync, sync.make_mixer(setup))
    state._bound.settings = list(settings)
    return state


# A tape lives one step: its state is kept on the strategy object instead.
_TAPE_STATE = "_hvdx_tensorflow_state"


def tape_state(sync, setup, settings) -> MixingState:
    """The state every tape given ``sync`` shares, made (:func:`new_state`) by the first
    tape, from the resolution the tapes share (:func:`hvdx.tensorflow.jobs.resolve_sync`)."""
    state = getattr(sync, _TAPE_STATE, None)
    if state is None:
        state = new_state(sync, setup, settings)
        setattr(sync, _TAPE_STATE, state)
    return state


@tf.autograph.experimental.do_not_convert
def state_of(sync) -> MixingState:
    """The state the tapes given the mixing strategy ``sync`` keep (made at the first
    call, collective: every rank calls it, or builds its first tape, at the same
    point)."""
    resolved = resolve_sync(sync, job(_hvd.Compression.none, _hvd.global_process_set),
                            "DistributedGradientTape", once=True)
    return tape_state(sync, resolved.setup, resolved.settings)


class _StateGetters:
    """``hvd.<name>(sync)`` (``hvd.dssync_state``, ``hvd.mixer_state``, ...): the
    function a mixing strategy's catalogue entry exports as
    ``"hvdx.tensorflow.mixing_state:STATE_GETTERS.<name>"`` (its ``state_exports``),
    made from the entry at first use. It gives :func:`state_of` for a spec of that
    entry (a registered mixer's entry shares the exports of the entry they all share),
    and refuses any other, naming the constructor; no strategy is named here."""

    def __getattr__(self, name: str):
        path = f"{__name__}:STATE_GETTERS.{name}"
        entry = next((d for d in catalogue.BUILT_IN if path in d.state_exports), None)
        if entry is None:
            raise AttributeError(name)
        constructor = next((c.name for c in entry.constructors), "mixer(...)")

        @tf.autograph.experimental.do_not_convert
        def getter(sync) -> MixingState:
            if not (isinstance(sync, MixingStrategy) and
                    path in _state_exports(sync.name)):
                raise ValueError(f"sync={sync!r} must be a hvdx.{constructor}")
            return state_of(sync)

        getter.__name__ = getter.__qualname__ = name
        getter.__doc__ = (
            f"The state ``DistributedGradientTape(tape, sync=sync)`` keeps for a "
            f"``hvdx.{constructor}`` (a :class:`MixingState`, made at the first "
            "call, collective: every rank calls it, or builds its first tape, at the "
            "same point). Put it in a ``tf.train.Checkpoint`` to resume the same "
            f"schedule; ``{name}(sync).synchronize_parameters()`` averages over all "
            "ranks.")
        setattr(self, name, getter)  # the same function at every look-up
        return getter


def _state_exports(name: str):
    """The state exports of the catalogue entry ``name`` (a registered mixer's entry
    has those of the entry all registered mixers share); none for an unknown name."""
    try:
        return catalogue.descriptor(name).state_exports
    except KeyError:
        return ()


#: The catalogue's TensorFlow state getters (:class:`_StateGetters`).
STATE_GETTERS = _StateGetters()
