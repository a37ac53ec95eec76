"""Fingerprints of what every rank must agree on before the first collective.

Horovod matches tensors across ranks by name and order. A rank whose model differs
(an extra layer, another shape, another dtype) or whose hvdx settings differ (another
compression ratio, another schedule seed) does not fail: it waits forever in a
collective that the other ranks never enter, or silently averages unrelated tensors.

hvdx therefore compares a fingerprint when an optimizer is built:

1. each rank lists ``(kind, key, value)`` entries: one per parameter in the order the
   optimizer iterates them (``value`` is dtype and shape), then one per setting;
2. the ranks exchange a short digest of their list (one small allgather);
3. only if the digests differ, they exchange the full lists and every rank computes the
   same message, so every rank raises the same ``ValueError``: the first rank's error
   where a rank could not build its settings (:func:`first_error`: a setting whose
   key ends in ``.error``), else the :func:`first_difference`.

The functions here are pure; the exchange is in :mod:`hvdx.mpi.consistency`.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence, Tuple

__all__ = ["Entry", "Fingerprint", "LAUNCH_PREFIX", "first_difference", "first_error"]

#: ``(kind, key, value)``: kind is ``"parameter"`` or ``"setting"``.
Entry = Tuple[str, str, str]

#: Settings whose key starts with this were read from the launch environment
#: (:mod:`hvdx.environment`): :func:`first_difference` reports them first.
LAUNCH_PREFIX = "HVDX_"


@dataclass(frozen=True)
class Fingerprint:
    """What one rank believes the whole job agrees on, in iteration order."""

    entries: Tuple[Entry, ...]
    #: Human names for entries whose key is positional (TensorFlow variable names may
    #: legitimately differ between ranks); used in messages, never compared.
    labels: Tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def build(cls, parameters: Iterable[Tuple[str, str, Sequence[int]]] = (),
              settings: Iterable[Tuple[str, object]] = (),
              labels: Sequence[str] = ()) -> "Fingerprint":
        """Build from ``(name, dtype, shape)`` triples and ``(name, value)`` settings.

        Settings are rendered with ``repr`` so that ``0.01`` and ``0.010000001`` differ.
        """
        entries = [("parameter", str(name), f"{dtype}{list(int(d) for d in shape)}")
                   for name, dtype, shape in parameters]
        entries += [("setting", str(name), repr(value)) for name, value in settings]
        return cls(tuple(entries), tuple(labels))

    def label(self, i: int) -> str:
        """The entry's key, with its human name where one was given."""
        key = self.entries[i][1]
        if i < len(self.labels) and self.labels[i]:
            return f"{key} ({self.labels[i]})"
        return key

    def digest(self) -> str:
        """A short, order-sensitive hash of all entries (the only thing sent normally)."""
        h = hashlib.sha256()
        for kind, key, value in self.entries:
            h.update(f"{kind}\x1f{key}\x1f{value}\x1e".encode())
        return h.hexdigest()[:32]


def first_error(fingerprints: Sequence[Fingerprint]) -> Optional[str]:
    """The error of the lowest rank that could not build its settings, or ``None``.

    A rank records such an error as a setting ``<what>.error`` whose value is the
    message (a ``ValueError`` kept for the cross-rank check instead of raised on that
    rank alone).
    """
    for rank, fingerprint in enumerate(fingerprints):
        for kind, key, value in fingerprint.entries:
            if kind == "setting" and key.endswith(".error"):
                try:
                    message = ast.literal_eval(value)
                except (ValueError, SyntaxError):
                    message = value
                return f"rank {rank} cannot use its {key[:-len('.error')]}: {message}"
    return None


def first_difference(fingerprints: Sequence[Fingerprint]) -> Optional[str]:
    """Describe the first entry on which the ranks disagree, or return ``None``.

    Settings read from the launch environment (keys starting with
    :data:`LAUNCH_PREFIX`, such as ``HVDX_SYNC``) are compared first: ranks launched
    with different values build different strategies, which then differ in everything
    else too (the variables may even be checked at another point). Then parameters,
    then the other settings; within each group, position by position (order matters:
    Horovod matches collectives in order). The result depends only on the list of
    fingerprints (index = rank), so every rank that evaluates it on the same gathered
    list produces the same message.
    """
    if not fingerprints:
        return None
    base = fingerprints[0]
    for rank, other in enumerate(fingerprints[1:], start=1):
        if other == base:
            continue
        for group in ("launch", "parameter", "setting"):
            message = _compare_group(group, base, other, rank)
            if message:
                return message
    return None


def _group(entry: Entry) -> str:
    kind, key, _ = entry
    return "launch" if kind == "setting" and key.startswith(LAUNCH_PREFIX) else kind


def _compare_group(group: str, base: Fingerprint, other: Fingerprint,
                   rank: int) -> Optional[str]:
    kind = "parameter" if group == "parameter" else "setting"
    a = [i for i, e in enumerate(base.entries) if _group(e) == group]
    b = [i for i, e in enumerate(other.entries) if _group(e) == group]
    for i, j in zip(a, b):
        ea, eb = base.entries[i], other.entries[j]
        if ea == eb:
            continue
        if ea[1] == eb[1]:
            return (f"{kind} '{base.label(i)}' differs between ranks: rank 0 has {ea[2]}, "
                    f"rank {rank} has {eb[2]}")
        return (f"rank 0 has {kind} '{base.label(i)}' ({ea[2]}) where rank {rank} has "
                f"{kind} '{other.label(j)}' ({eb[2]})")
    if len(a) == len(b):
        return None
    longer, indices, who, missing = ((base, a, 0, rank) if len(a) > len(b)
                                     else (other, b, rank, 0))
    k = indices[min(len(a), len(b))]
    return (f"{kind} '{longer.label(k)}' ({longer.entries[k][2]}) exists on rank {who} "
            f"but not on rank {missing}")
