"""Named counters with their starting values: the byte and step counters of hvdx's
strategies (``optimizer.hvdx_stats``)."""

from __future__ import annotations

from typing import ClassVar, Dict

__all__ = ["Counters"]


class Counters:
    """A subclass lists its counters and their starting values in ``INITIAL`` (in the
    order :meth:`as_dict` gives them) and sets ``__slots__ = tuple(INITIAL)``."""

    __slots__ = ()
    INITIAL: ClassVar[Dict[str, object]] = {}

    def __init__(self):
        for name, value in self.INITIAL.items():
            setattr(self, name, value)

    def as_dict(self) -> Dict[str, object]:
        return {name: getattr(self, name) for name in self.INITIAL}

    def __repr__(self):
        return f"{type(self).__name__}({self.as_dict()})"
