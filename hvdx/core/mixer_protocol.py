"""The one protocol of every parameter-mixing strategy: :class:`Mixer` and the exchanges
it asks for.

A mixing strategy (DS-Sync's groups, decentralized SGD's graphs, a user's mixer
registered with ``hvdx.register_mixer``) says *what* each step averages; one driver per
framework (:mod:`hvdx.torch.mixing_driver`, :mod:`hvdx.tensorflow.mixing_state`) does
*how*, after PyTorch's ``ModelAverager`` / ``PostLocalSGDOptimizer`` split. Each step
``t`` the driver:

1. asks the mixer for the step's exchange, ``mixer.exchange(t, everyone)``
   (``everyone``: a ``global_every`` step,
   :meth:`hvdx.strategy_contract.MixingStrategy.global_due`);
2. runs it on the framework's tensors:

   - :class:`Everyone`: the mean over all ranks (Horovod's grouped allreduce);
   - :class:`Group`: the mean inside a Horovod process set (DS-Sync);
   - :class:`Neighbours`: ``x_i <- w_ii x_i + sum_j w_ij x_j`` with the ranks ``j`` the
     step names, one fused buffer per dtype family by mpi4py point-to-point
     (:class:`hvdx.mpi.neighbor_exchange.FusedExchange`); with the mixer's
     :attr:`Mixer.combines_first`, torch starts it after the local step and completes it
     in the next one, so it overlaps the forward and backward pass;
   - :class:`Custom`: the mixer's own :meth:`Mixer.mix` on numpy copies (the default:
     :meth:`Mixer.matrix` through ``peers.by_matrix``);
   - :class:`Skip`: nothing this step (``mix_every``);

3. counts it in the mixer's ``stats`` (:meth:`Mixer.count`), and keeps the step counter,
   the SWA merge and the checkpoint entry (:meth:`Mixer.state`).

A user's mixer implements :meth:`Mixer.matrix` or :meth:`Mixer.mix`; a built-in one
implements :meth:`Mixer.exchange` and may declare the optional capabilities
(:attr:`Mixer.combines_first`, :attr:`Mixer.views`, :attr:`Mixer.state_entry`,
:meth:`Mixer.bind`). ``hvdx.register_mixer`` refuses a class that implements none of
``matrix``, ``mix`` and ``exchange``.

Numpy and the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional, Tuple

import numpy as np

__all__ = ["Custom", "Everyone", "Group", "MIXER_METHODS", "Mixer", "Neighbours", "Skip",
           "check_matrix", "mixed_arrays"]


@dataclass(frozen=True)
class Everyone:
    """The mean over all ranks (Horovod's grouped allreduce, one call per dtype)."""


@dataclass(frozen=True)
class Group:
    """The mean inside ``ranks`` through Horovod's ``process_set`` (nothing is sent in
    a group of one).

    Attributes:
        ranks: the group, ascending; this rank is one of them.
        process_set: Horovod's process set of ``ranks``.
        name: the prefix of Horovod's tensor names, the same on every member.
    """

    ranks: Tuple[int, ...]
    process_set: Any
    name: str


@dataclass(frozen=True)
class Neighbours:
    """``x_i <- self_weight x_i + sum_j recv_weights[j] x_j`` with this rank's
    neighbours (:class:`hvdx.core.mixing_graphs.Neighbors`: ``send_to``,
    ``recv_from``, ``self_weight``, ``recv_weights``)."""

    neighbours: Any


@dataclass(frozen=True)
class Custom:
    """The mixer's own :meth:`Mixer.mix` on numpy copies of the tensors."""


@dataclass(frozen=True)
class Skip:
    """Nothing to mix at this step."""


#: The methods of which a mixer implements at least one.
MIXER_METHODS = ("matrix", "mix", "exchange")


class Mixer:
    """Subclass this, then ``hvdx.register_mixer("name", YourMixer)``.

    Implement :meth:`matrix` (the common case) or :meth:`mix` (anything else); the
    built-in mixers implement :meth:`exchange`. The constructor takes the arguments of
    ``hvdx.mixer("name", ...)`` and of ``HVDX_SYNC=name(...)``; raise ``ValueError``
    naming a bad one. Every rank builds its own instance: draw randomness from
    :meth:`settings` and ``step``, never from the rank, so that every rank computes the
    same matrix.
    """

    #: Optional capability: mix ``x_t`` before the local step (combine-then-adapt)
    #: instead of after it. torch then starts a :class:`Neighbours` exchange when a
    #: step ends and completes it in the next one, overlapping the forward and backward
    #: pass; Keras mixes before ``apply_gradients``' local step.
    combines_first: bool = False
    #: Optional capability: attributes the driver's optimizer (torch) and state
    #: (TensorFlow) show of this mixer, ``{their name: this mixer's attribute}``
    #: (``{"hvdx_graph": "graph"}``).
    views: ClassVar[Dict[str, str]] = {}
    #: Where the driver keeps :meth:`state` in the checkpoint entry: under this key, or,
    #: with ``None``, as keys of the entry itself (beside ``step`` and ``swa_count``).
    state_entry: ClassVar[Optional[str]] = "mixer"
    #: The byte counters (``optimizer.hvdx_stats``); the driver sets a
    #: :class:`hvdx.core.counters.MixingStats` where a mixer has none.
    stats: Any = None

    def bind(self, horovod) -> None:
        """Called once by the driver, on every rank, before the first step, with
        Horovod's framework module (``horovod.torch``, ``horovod.tensorflow``): a mixer
        that registers process sets does it here (collective)."""

    def exchange(self, step: int, everyone: bool):
        """Step ``step``'s exchange (module docstring): :class:`Everyone` at a
        ``global_every`` step, else :class:`Custom` (:meth:`mix`)."""
        return Everyone() if everyone else Custom()

    def matrix(self, step: int, size: int):
        """The mixing matrix of step ``step`` (0-based, saved in checkpoints): ``size x
        size``, non-negative, every row summing to 1 (``x_i <- sum_j W[i, j] x_j``);
        doubly stochastic keeps the ranks' mean. The same on every rank."""
        raise NotImplementedError(f"{type(self).__qualname__}: implement matrix(step, "
                                  "size) or mix(step, arrays, peers)")

    def mix(self, step: int, arrays: List[np.ndarray], peers) -> List[np.ndarray]:
        """This rank's mixed arrays at step ``step`` (collective: every rank calls it
        with its arrays in the same order, shapes and dtypes). ``peers``:
        :class:`hvdx.mpi.user_mixer_exchange.Peers`. The default mixes by
        :meth:`matrix`; an exception of :meth:`matrix` is handed to ``by_matrix``,
        which raises it on every rank (raised here, it would end this rank alone and
        leave the others waiting for its messages)."""
        try:
            w = self.matrix(step, peers.size)
        except Exception as error:  # noqa: BLE001 (the user's code: any exception)
            w = error
        return peers.by_matrix(w, arrays)

    def count(self, exchange, model_bytes: int, size: int, traffic=None) -> None:
        """Count one step's ``exchange`` of ``model_bytes`` bytes in :attr:`stats`
        (``traffic``: ``(bytes, messages)`` a :class:`Neighbours` exchange sent).
        :class:`Everyone` and :class:`Group` count as a ring allreduce; a
        :class:`Custom` step counts itself (``peers`` does)."""
        if isinstance(exchange, Everyone):
            self.stats.add_everyone(model_bytes, size)
        elif isinstance(exchange, Group):
            self.stats.add_everyone(model_bytes, len(exchange.ranks))
        elif isinstance(exchange, Neighbours):
            self.stats.record(*traffic)
        elif isinstance(exchange, Skip):
            self.stats.record(0, 0)

    def settings(self) -> Dict[str, object]:
        """Everything every rank must share (seeds, weights): compared across ranks
        before the first step, as ``repr`` of the sorted items."""
        return {}

    def state(self) -> Dict[str, object]:
        """The mixer's own state beyond the step (JSON-serialisable), for checkpoints."""
        return {}

    def load_state(self, state: Dict[str, object]) -> None:
        """Restore :meth:`state`'s dictionary."""


def mixed_arrays(mixer: Mixer, step: int, arrays: List[np.ndarray],
                 peers) -> List[np.ndarray]:
    """A :class:`Custom` step: ``mixer.mix(step, arrays, peers)``, checked to be a list
    of arrays of the shapes given, else ``ValueError`` naming the mixer and what it
    returned."""
    what = f"{type(mixer).__qualname__}.mix(step={step})"
    if peers is not None:
        peers.step = step  # (for by_matrix's messages)
    mixed = mixer.mix(step, arrays, peers)
    if not isinstance(mixed, (list, tuple)) or len(mixed) != len(arrays):
        raise ValueError(f"{what} returned {type(mixed).__name__}; return a list of "
                         f"{len(arrays)} arrays, one per array given")
    out = [np.asarray(value) for value in mixed]
    for a, value in zip(arrays, out):
        if value.shape != a.shape:
            raise ValueError(f"{what} returned shape {value.shape} for an array of "
                             f"shape {a.shape}")
    return out


def check_matrix(w, n: int, what: str) -> np.ndarray:
    """``w`` as a float64 ``n x n`` array, non-negative, finite, rows summing to 1;
    else ``ValueError`` naming ``what``."""
    try:
        m = np.array(w, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{what} returned {type(w).__name__}, not a matrix of "
                         "numbers") from None
    if m.shape != (n, n):
        raise ValueError(f"{what} returned shape {m.shape}; the job has {n} ranks, so "
                         f"return an {n}x{n} matrix")
    if not np.all(np.isfinite(m)) or np.any(m < 0):
        raise ValueError(f"{what}: every entry must be finite and non-negative")
    sums = m.sum(axis=1)
    bad = np.flatnonzero(np.abs(sums - 1.0) > 1e-9 * n)
    if bad.size:
        raise ValueError(f"{what}: row {int(bad[0])} sums to {float(sums[bad[0]])!r}; "
                         "every row of a mixing matrix sums to 1")
    return m
