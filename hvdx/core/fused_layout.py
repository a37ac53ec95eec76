"""Where each tensor lies in the fused buffers of a neighbour exchange.

Decentralized SGD sends the whole model to each neighbour once per step. One message
per tensor would pay one latency per tensor; hvdx packs every tensor into ONE contiguous
1-D buffer per *dtype family* instead (:mod:`hvdx.mpi.neighbor_exchange`):

1. every tensor joins a family by its dtype: float64 stays float64; every other
   floating dtype travels as float32 (numpy has no bfloat16, and float16 is combined
   more accurately in float32);
2. within a family the tensors lie back to back, in the order given (the same on every
   rank), each at ``offset`` for ``count`` elements;
3. the families are ordered by name, so every rank exchanges them in the same order;
4. with ``flags=True`` (Stanza's role sums), the first family's buffer ends with one
   more element per tensor, its *presence flag*: 1 where this rank has the tensor, 0
   where it has none (its slot then holds zeros). An allreduce that sums the buffers
   sums the flags too: each then counts the ranks that had the tensor, the same count
   on every rank, so the ranks agree which tensors no rank had without a message of
   their own.

The layout is framework-neutral: the PyTorch and TensorFlow adapters describe their
tensors by dtype name and element count and copy them in and out themselves.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Sequence, Tuple

import numpy as np

__all__ = ["FusedLayout", "Slot", "family_of"]


def family_of(dtype_name: str) -> np.dtype:
    """The fused buffer's dtype for a tensor of dtype ``dtype_name`` (step 1).

    Accepts framework spellings too: ``"float64"``, ``"torch.float64"``, ``"double"``.
    """
    name = str(dtype_name).rsplit(".", 1)[-1]
    return np.dtype(np.float64) if name in ("float64", "double") else np.dtype(np.float32)


class Slot(NamedTuple):
    """One tensor's place in its family's buffer."""

    index: int   # position in the list the layout was built from
    offset: int  # first element in the buffer
    count: int   # elements


class FusedLayout:
    """The fused buffers of one list of tensors (module docstring).

    Args:
        tensors: ``(dtype name, element count)`` per tensor, in exchange order.
        flags: add a presence flag per tensor (step 4).

    Attributes:
        key: the tuple built from, to tell when tensors changed and the layout must be
            rebuilt.
        families: ``{family dtype: total elements}`` (flags included), in exchange order
            (step 3).
        slots: ``{family dtype: [Slot, ...]}`` in tensor order.
        ends: ``{family dtype: elements holding tensor values}``; the flags, if any,
            follow them in the first family.
        flag_family: the family whose buffer holds the flags; ``None`` without flags or
            without tensors.
    """

    def __init__(self, tensors: Sequence[Tuple[str, int]], flags: bool = False):
        self.key = tuple((str(name), int(count)) for name, count in tensors)
        counts: Dict[np.dtype, int] = {}
        slots: Dict[np.dtype, List[Slot]] = {}
        for index, (name, count) in enumerate(self.key):
            if count < 0:
                raise ValueError(f"tensor {index}: element count {count} is negative")
            family = family_of(name)
            offset = counts.get(family, 0)
            slots.setdefault(family, []).append(Slot(index, offset, count))
            counts[family] = offset + count
        order = sorted(counts, key=lambda dtype: dtype.name)
        self.ends: Dict[np.dtype, int] = {f: counts[f] for f in order}
        self.flag_family = order[0] if flags and order else None
        if self.flag_family is not None:
            counts[self.flag_family] += len(self.key)
        self.families: Dict[np.dtype, int] = {f: counts[f] for f in order}
        self.slots: Dict[np.dtype, List[Slot]] = {f: slots[f] for f in order}

    def set_flags(self, buffers: Dict[np.dtype, np.ndarray], present: Sequence[bool]) -> None:
        """Write the presence flags (step 4): ``present[i]`` says whether this rank has
        tensor ``i``."""
        if len(present) != len(self.key):
            raise ValueError(f"the layout holds {len(self.key)} tensors, got "
                             f"{len(present)} flags")
        if self.flag_family is not None:
            end = self.ends[self.flag_family]
            buffers[self.flag_family][end:end + len(self.key)] = \
                np.asarray(present, dtype=bool)
        elif len(self.key):
            raise ValueError("this layout was built without flags")

    def flag_counts(self, buffers: Dict[np.dtype, np.ndarray]) -> np.ndarray:
        """The flags read back (int64, one per tensor): after a summing allreduce, how
        many ranks had each tensor."""
        if self.flag_family is None:
            if len(self.key):
                raise ValueError("this layout was built without flags")
            return np.zeros(0, np.int64)
        end = self.ends[self.flag_family]
        return np.rint(buffers[self.flag_family][end:end + len(self.key)]).astype(np.int64)

    def pack(self, values: Sequence[np.ndarray],
             out: Dict[np.dtype, np.ndarray] = None) -> Dict[np.dtype, np.ndarray]:
        """One buffer per family holding ``values`` (numpy arrays, in layout order),
        written into ``out`` (reused buffers from an earlier call) when given."""
        if len(values) != len(self.key):
            raise ValueError(f"the layout holds {len(self.key)} tensors, got {len(values)}")
        # New buffers start at zero: flags, if any, say "absent" until set_flags.
        buffers = out if out is not None else {
            f: np.zeros(count, dtype=f) for f, count in self.families.items()}
        for family, slots in self.slots.items():
            buffer = buffers[family]
            for slot in slots:
                buffer[slot.offset:slot.offset + slot.count] = \
                    np.asarray(values[slot.index]).reshape(-1)
        return buffers

    def unpack(self, buffers: Dict[np.dtype, np.ndarray],
               like: Sequence[np.ndarray]) -> List[np.ndarray]:
        """The tensors' values read back from ``buffers``, each with the shape and
        dtype of the matching array of ``like``."""
        result: List[np.ndarray] = [None] * len(self.key)
        for family, slots in self.slots.items():
            buffer = buffers[family]
            for slot in slots:
                template = np.asarray(like[slot.index])
                result[slot.index] = buffer[slot.offset:slot.offset + slot.count] \
                    .reshape(template.shape).astype(template.dtype, copy=True)
        return result
