"""The checkpointable state of a compression strategy's run in TensorFlow, once for
TopK (:class:`hvdx.strategies.topk.tensorflow.adapters.TopKState`) and a registered
compressor (:class:`hvdx.tensorflow.user_compression.CompressionState`).

1. A state is a ``tf.Module`` whose ``residuals`` attribute ``tf.train.Checkpoint``
   saves as one string tensor (:class:`SerializedState`): the strategy's
   ``state_dict()`` as a ``.npz`` of a JSON header and the arrays.
2. It is bound on the first synchronization (:meth:`ResidualState._bound`) to the
   variables' names and the spec; a checkpoint restored before that is kept and applied
   then, after checking that it holds this rank's residuals (residuals belong to the
   rank that accumulated them; found at the first step, a wrong one would stop some
   ranks and leave the others waiting in the exchange).
3. ``stats`` exists before the first step, so the step log can hold it from the start.
4. A tape lives one step: tapes find their state by their list of variables
   (:class:`StatesByVariables`).
"""

from __future__ import annotations

import io
import json
import weakref
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

__all__ = ["ResidualState", "SerializedState", "StatesByVariables"]


class SerializedState(tf.train.experimental.PythonState):
    """What ``tf.train.Checkpoint`` saves of a :class:`ResidualState`: one string."""

    def __init__(self, owner):
        self._owner = weakref.ref(owner)

    def serialize(self):
        return self._owner()._serialize()

    def deserialize(self, string_value):
        self._owner()._deserialize(string_value)


class ResidualState(tf.Module):
    """Residuals, step counter and byte counters of one run, checkpointable (module
    docstring). A subclass gives the counters' class (``STATS``), the state of a run
    not started yet (:meth:`_empty`), how its state splits into a JSON header and arrays
    (:meth:`_encode`, :meth:`_decode`) and how a restored state is checked
    (:meth:`_check_saved`)."""

    STATS: type = type(None)

    def __init__(self, name: str):
        super().__init__(name=name)
        # A trackable attribute: tf.train.Checkpoint saves it as this module's dependency.
        self.residuals = SerializedState(self)
        self._stats = self.STATS()
        self._synchronizer = None
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

    def _bound(self, make: Callable[[], object], same: Callable[[object], bool],
               refusal: Callable[[object], str]):
        """The synchronizer: ``make()`` on the first call (with this state's counters
        and any restored checkpoint); later, the same one if ``same(it)``, else
        ``ValueError(refusal(it))``."""
        sync = self._synchronizer
        if sync is None:
            sync = make()
            sync.stats = self._stats  # the counters the state handed out already
            if self._pending is not None:
                sync.load_state_dict(self._pending)
                self._pending = None
            self._synchronizer = sync
        elif not same(sync):
            raise ValueError(refusal(sync))
        return sync

    def _empty(self) -> dict:
        raise NotImplementedError

    def _encode(self, state: dict) -> Tuple[dict, Dict[str, np.ndarray]]:
        raise NotImplementedError

    def _decode(self, header: dict, arrays) -> dict:
        raise NotImplementedError

    def _check_saved(self, state: dict) -> None:
        """Raise ``ValueError`` if a restored ``state`` is not this rank's."""

    def _serialize(self) -> bytes:
        state = (self._synchronizer.state_dict() if self._synchronizer is not None
                 else self._pending)
        header, arrays = self._encode(self._empty() if state is None else state)
        buffer = io.BytesIO()
        np.savez(buffer, header=np.frombuffer(json.dumps(header).encode(), np.uint8),
                 **arrays)
        return buffer.getvalue()

    def _deserialize(self, value: bytes) -> None:
        with np.load(io.BytesIO(value)) as data:
            state = self._decode(json.loads(data["header"].tobytes().decode()), data)
        if self._synchronizer is None:
            self._check_saved(state)
            self._pending = state
        else:
            self._synchronizer.load_state_dict(state)


class StatesByVariables:
    """One state per list of variables, for tapes (which live one step each): the same
    list, in the same order, finds the same state while its variables live."""

    def __init__(self, make: Callable[[], ResidualState]):
        self._make = make
        self._states: Dict[Tuple[int, ...], Tuple[List[weakref.ref], ResidualState]] = {}

    def __call__(self, variables) -> ResidualState:
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
