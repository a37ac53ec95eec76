"""Named counters with their starting values: the byte and step counters of hvdx's
strategies (``optimizer.hvdx_stats``)."""

from __future__ import annotations

import copy
from typing import ClassVar, Dict

__all__ = ["Counters", "MixingStats"]


class Counters:
    """A subclass lists its counters and their starting values in ``INITIAL`` (in the
    order :meth:`as_dict` gives them) and sets ``__slots__ = tuple(INITIAL)``.

    A starting value may be a container (a dict of per-kind counters): each object gets
    its own copy, so that two objects never count into one dict. A subclass that offers
    methods to count names them as the others do: ``record`` adds what moved,
    ``begin_step`` / ``end_step`` open and close a step whose ``last_*`` figures are
    its own."""

    __slots__ = ()
    INITIAL: ClassVar[Dict[str, object]] = {}

    def __init__(self):
        for name, value in self.INITIAL.items():
            setattr(self, name, copy.deepcopy(value))

    def as_dict(self) -> Dict[str, object]:
        return {name: getattr(self, name) for name in self.INITIAL}

    def __repr__(self):
        return f"{type(self).__name__}({self.as_dict()})"


class MixingStats(Counters):
    """The counters of any parameter mixer that exchanges with its neighbours: bytes and
    messages this rank sent (payload only), steps taken. Decentralized SGD's graphs
    count with it (``hvdx.Decentralized``'s ``DecentralizedStats`` is this class), and
    so does a registered mixer (:mod:`hvdx.mixer_registry`)."""

    INITIAL = {"steps": 0, "last_bytes": 0.0, "total_bytes": 0.0, "last_messages": 0,
               "total_messages": 0, "global_steps": 0}
    __slots__ = tuple(INITIAL)

    def record(self, nbytes: float, messages: int, everyone: bool = False) -> None:
        """Count one step that sent ``nbytes`` bytes in ``messages`` messages: add to
        ``steps``, ``total_bytes`` and ``total_messages``, set ``last_bytes`` and
        ``last_messages``, and add one to ``global_steps`` if ``everyone`` (a step
        averaged over all ranks)."""
        self.steps += 1
        self.last_bytes = float(nbytes)
        self.total_bytes += float(nbytes)
        self.last_messages = messages
        self.total_messages += messages
        self.global_steps += int(everyone)

    def add_everyone(self, nbytes: float, n: int) -> None:
        """A step that averaged ``nbytes`` over all ``n`` ranks (``global_every``,
        ``synchronize_parameters``), counted as a ring allreduce: ``2 (n - 1) / n``."""
        self.record(2.0 * (n - 1) / n * nbytes, 0, everyone=True)
