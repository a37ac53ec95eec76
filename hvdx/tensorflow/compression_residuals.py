"""The checkpointable state of a compression strategy's run in TensorFlow, one class for
every strategy (TopK's, a registered compressor's), and ``hvd.topk_state`` /
``hvd.compression_state``, the states that tapes keep.

1. A :class:`CompressionState` is a ``tf.Module`` whose ``residuals`` attribute
   ``tf.train.Checkpoint`` saves as one string tensor (:class:`SerializedState`): the
   synchronizer's ``state_dict()`` as a ``.npz`` of a JSON header and the arrays (the
   synchronizer's ``ARRAY_ENTRIES``, each a dict of arrays by tensor name).
2. It is made for one synchronizer class (the catalogue entry's ``synchronizer``) and
   bound on the first synchronization (:meth:`CompressionState.bind`) to the
   variables' names and the spec; a checkpoint restored before that is kept and
   applied then, after checking that it holds this rank's residuals (residuals belong
   to the rank that accumulated them; found at the first step, a wrong one would stop
   some ranks and leave the others waiting in the exchange).
3. ``stats`` exists before the first step (the synchronizer's ``STATS``), so the step
   log can hold it from the start.
4. A tape lives one step: tapes find their state by their list of variables
   (:class:`StatesByVariables`), one table per synchronizer class
   (:func:`tape_state`); each catalogue entry exports its getter
   (:data:`STATE_GETTERS`, ``hvd.topk_state``).
"""

from __future__ import annotations

import io
import json
import weakref
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

__all__ = ["CompressionState", "STATE_GETTERS", "SerializedState", "StatesByVariables",
           "tape_state"]


class SerializedState(tf.train.experimental.PythonState):
    """What ``tf.train.Checkpoint`` saves of a :class:`CompressionState`: one string."""

    def __init__(self, owner):
        self._owner = weakref.ref(owner)

    def serialize(self):
        return self._owner()._serialize()

    def deserialize(self, string_value):
        self._owner()._deserialize(string_value)


class CompressionState(tf.Module):
    """Residuals, step counter and byte counters of one compression run, checkpointable
    (module docstring).

    Args:
        synchronizer_class: the class whose ``state_dict()`` this holds (a catalogue
            entry's ``synchronizer``): it gives the counters (``STATS``), the state of
            a run not started yet (``empty_state()``), the entries that hold arrays
            (``ARRAY_ENTRIES``) and the check of a restored state
            (``check_saved_rank``).
        name: the module's name (default: the class's ``TENSORFLOW_ATTRIBUTE``).

    Attributes:
        stats: the synchronizer's byte counters (``optimizer.hvdx_stats`` in PyTorch).
        synchronizer: the synchronizer (``None`` before the first step).
    """

    def __init__(self, synchronizer_class: type, name: Optional[str] = None):
        super().__init__(name=name or synchronizer_class.TENSORFLOW_ATTRIBUTE)
        self._class = synchronizer_class
        # A trackable attribute: tf.train.Checkpoint saves it as this module's dependency.
        self.residuals = SerializedState(self)
        self._stats = synchronizer_class.STATS()
        self._synchronizer = None
        self._spec = None
        self._pending: Optional[dict] = None

    @property
    def stats(self):
        return self._stats

    @property
    def synchronizer(self):
        """The synchronizer (``None`` before the first step)."""
        return self._synchronizer

    @property
    def step(self) -> int:
        if self._synchronizer is None:
            return 0 if self._pending is None else int(self._pending["step"])
        return self._synchronizer.step

    def bind(self, names: List[str], spec, comm, sum_op: bool, labels: List[str],
             shapes: List[tuple]):
        """The synchronizer for these variables and settings: made on the first call
        (with this state's counters and any restored checkpoint); later the same one,
        or ``ValueError`` if the variables, the spec or the op differ."""
        sync = self._synchronizer
        if sync is None:
            sync = self._class.for_spec(names, spec, comm, sum_op=sum_op, labels=labels,
                                        shapes=shapes)
            sync.stats = self._stats  # the counters the state handed out already
            if self._pending is not None:
                sync.load_state_dict(self._pending)
                self._pending = None
            self._synchronizer, self._spec = sync, spec
        elif (sync.names, self._spec.describe(), sync.sum_op) != \
                (tuple(names), spec.describe(), sum_op):
            raise ValueError(
                f"these variables are already synchronized with "
                f"'{self._spec.describe()}' (op={'Sum' if sync.sum_op else 'Average'}); "
                "one list of variables takes one compression setting")
        return sync

    def _encode(self, state: dict) -> Tuple[dict, Dict[str, np.ndarray]]:
        """A JSON header (everything small) and the arrays (``ARRAY_ENTRIES``)."""
        header = {k: v for k, v in state.items() if k not in self._class.ARRAY_ENTRIES}
        arrays = {}
        for entry in self._class.ARRAY_ENTRIES:
            header[entry] = list(state[entry])
            for i, e in enumerate(state[entry].values()):
                arrays[f"{entry}{i}"] = e
        return header, arrays

    def _decode(self, header: dict, arrays) -> dict:
        state = dict(header)
        for entry in self._class.ARRAY_ENTRIES:
            state[entry] = {n: arrays[f"{entry}{i}"].copy()
                            for i, n in enumerate(header[entry])}
        return state

    def _serialize(self) -> bytes:
        state = (self._synchronizer.state_dict() if self._synchronizer is not None
                 else self._pending)
        header, arrays = self._encode(self._class.empty_state() if state is None
                                      else state)
        buffer = io.BytesIO()
        np.savez(buffer, header=np.frombuffer(json.dumps(header).encode(), np.uint8),
                 **arrays)
        return buffer.getvalue()

    def _deserialize(self, value: bytes) -> None:
        with np.load(io.BytesIO(value)) as data:
            state = self._decode(json.loads(data["header"].tobytes().decode()), data)
        if self._synchronizer is None:
            import horovod.tensorflow as hvd

            self._class.check_saved_rank(state, hvd.rank())
            self._pending = state
        else:
            self._synchronizer.load_state_dict(state)


class StatesByVariables:
    """One state per list of variables, for tapes (which live one step each): the same
    list, in the same order, finds the same state while its variables live."""

    def __init__(self, make: Callable[[], CompressionState]):
        self._make = make
        self._states: Dict[Tuple[int, ...], Tuple[List[weakref.ref], "CompressionState"]] = {}

    def __call__(self, variables) -> CompressionState:
        variables = tf.nest.flatten(variables)
        key = tuple(id(v) for v in variables)
        entry = self._states.get(key)
        if entry is not None and all(r() is v for r, v in zip(entry[0], variables)):
            return entry[1]
        for stale in [k for k, (refs, _) in self._states.items()
                      if any(r() is None for r in refs)]:
            del self._states[stale]
        state = self._make()
        self._states[key] = ([weakref.ref(v) for v in variables], state)
        return state


#: The tapes' states, one table per synchronizer class.
_TAPE_STATES: Dict[type, StatesByVariables] = {}


def tape_state(synchronizer_class: type, variables) -> CompressionState:
    """The :class:`CompressionState` that tapes running ``synchronizer_class`` keep for
    ``variables`` (made if missing)."""
    table = _TAPE_STATES.get(synchronizer_class)
    if table is None:
        table = _TAPE_STATES[synchronizer_class] = StatesByVariables(
            lambda: CompressionState(synchronizer_class))
    return table(variables)


class _StateGetters:
    """``hvd.<name>(variables)`` (``hvd.topk_state``, ``hvd.compression_state``): the
    function a compression strategy's catalogue entry exports as
    ``"hvdx.tensorflow.compression_residuals:STATE_GETTERS.<name>"`` (its
    ``state_exports``), made from the entry at first use; no strategy is named here."""

    def __getattr__(self, name: str):
        from hvdx.strategies import catalogue
        from hvdx.strategies.descriptor import load

        path = f"{__name__}:STATE_GETTERS.{name}"
        entry = next((d for d in catalogue.BUILT_IN if path in d.state_exports), None)
        if entry is None or entry.synchronizer is None:
            raise AttributeError(name)
        synchronizer_class = load(entry.synchronizer)

        @tf.autograph.experimental.do_not_convert
        def getter(variables) -> CompressionState:
            return tape_state(synchronizer_class, variables)

        getter.__name__ = getter.__qualname__ = name
        getter.__doc__ = (
            f"The :class:`CompressionState` that tapes running {entry.title} keep for "
            "``variables`` (made if missing). Pass the same list, in the same order, as "
            "the ``sources`` of ``tape.gradient`` (without those registered with "
            "``register_local_source``, which Horovod keeps out of the "
            "synchronization), and put it in a ``tf.train.Checkpoint`` before "
            f"training: ``tf.train.Checkpoint(model=model, optimizer=opt, "
            f"state=hvd.{name}(model.trainable_variables))``.")
        setattr(self, name, getter)  # the same function at every look-up
        return getter


#: The catalogue's TensorFlow state getters (:class:`_StateGetters`).
STATE_GETTERS = _StateGetters()
