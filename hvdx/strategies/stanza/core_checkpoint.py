"""A Stanza checkpoint as one byte string, framework-neutral: what each rank saves and checks.

Stanza (Wu, Xu, Li, Xiong, arXiv 1812.10624) gives each rank one part of the model, so
each rank saves its own state. :mod:`hvdx.strategies.stanza.tensorflow.trainer` keeps it
in one string tensor (TensorFlow assigns separate variables as it reads them, so a
mismatch could show half-way through a load); this module holds that string:

1. :func:`encode_state`: a ``.npz`` (no pickle) of a JSON header (``format``, the role
   layout, the step, and ``[dtype, shape]`` of every array, :func:`describe`) and the
   raw bytes of the part's weights and of the optimizer's variables, back to back
   (:func:`concat_bytes`);
2. :func:`decode_state`: the header and both byte strings, or the message for a
   foreign or damaged payload; :func:`state_error`: why a header does not fit this
   trainer (another format, layout, or arrays of other shapes or dtypes,
   :func:`arrays_mismatch`), or ``None``;
3. :func:`arrays_from_bytes`: the byte strings back into arrays of the given dtypes and
   shapes, which the trainer assigns only once every rank's state fits.

numpy and the standard library only.
"""

from __future__ import annotations

import io
import json
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from hvdx.strategies.stanza.core_checks import layout_error

__all__ = ["arrays_from_bytes", "arrays_mismatch", "as_bytes", "concat_bytes",
           "decode_state", "describe", "encode_state", "state_error"]


def as_bytes(array: np.ndarray) -> np.ndarray:
    """A host, C-contiguous array's bytes as a numpy view (any dtype, bfloat16 too)."""
    return array.reshape(-1).view(np.uint8)


def concat_bytes(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The arrays' bytes back to back (an empty byte array for none)."""
    parts = [as_bytes(np.ascontiguousarray(a)) for a in arrays]
    return np.concatenate(parts) if parts else np.empty(0, np.uint8)


def arrays_from_bytes(buffer: np.ndarray,
                      specs: Sequence[Tuple[np.dtype, Tuple[int, ...]]]) -> List[np.ndarray]:
    """Inverse of :func:`concat_bytes`: one array per ``(dtype, shape)``, in order.

    Raises:
        RuntimeError: if ``buffer`` holds another number of bytes than the arrays.
    """
    arrays, offset = [], 0
    for dtype, shape in specs:
        count = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        # copy(): an aligned array, so that the bytes can be viewed as the dtype.
        arrays.append(buffer[offset:offset + count].copy().view(dtype).reshape(shape))
        offset += count
    if offset != buffer.size:
        raise RuntimeError(f"hvdx.Stanza: {buffer.size} bytes of weights for variables of "
                           f"{offset} bytes")
    return arrays


def describe(array: np.ndarray) -> List[object]:
    """``[dtype name, shape]``, as the header records an array."""
    return [array.dtype.name, list(array.shape)]


def encode_state(format_: str, layout: dict, step: int, module: Sequence[np.ndarray],
                 optimizer: Sequence[np.ndarray]) -> bytes:
    """Step 1: the payload of one rank's state."""
    header = {"format": format_, "layout": layout, "step": step,
              "module": [describe(a) for a in module],
              "optimizer": [describe(a) for a in optimizer]}
    buffer = io.BytesIO()
    np.savez(buffer, header=np.frombuffer(json.dumps(header).encode(), np.uint8),
             module=concat_bytes(module), optimizer=concat_bytes(optimizer))
    return buffer.getvalue()


def decode_state(payload: bytes, rank: int
                 ) -> Tuple[object, Optional[Dict[str, np.ndarray]], Optional[str]]:
    """Step 2: ``(header, {"module", "optimizer"} bytes, None)``, or ``(None, None,
    message)`` for a payload that is not a readable ``.npz`` with a JSON header."""
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as data:
            parsed = {name: data[name] for name in ("header", "module", "optimizer")}
        header = json.loads(parsed.pop("header").tobytes().decode())
    except Exception as exc:  # a foreign or damaged payload
        return None, None, (f"Stanza.state: rank {rank}'s checkpoint holds no readable "
                            f"Stanza state: {type(exc).__name__}: {exc}")
    return header, parsed, None


def state_error(header: object, format_: str, what: str, rank: int, expected: dict,
                module: Sequence[List[object]], module_names: Sequence[str],
                optimizer: Sequence[List[object]], optimizer_names: Sequence[str]
                ) -> Optional[str]:
    """Step 2: why ``header`` does not fit a trainer of layout ``expected`` whose part
    and optimizer hold arrays ``[[dtype, shape], ...]`` (their names for the message),
    or ``None``; ``what``: the header in words, for a foreign one."""
    if not isinstance(header, dict) or header.get("format") != format_:
        return f"Stanza.state: rank {rank}'s checkpoint holds {what}, not a Stanza state"
    return (layout_error("Stanza.state", rank, header.get("layout"), expected)
            or arrays_mismatch("module", module, module_names, header.get("module"), rank)
            or arrays_mismatch("optimizer", optimizer, optimizer_names,
                               header.get("optimizer"), rank))


def arrays_mismatch(what: str, mine: Sequence[List[object]], names: Sequence[str],
                    saved: object, rank: int) -> Optional[str]:
    """Why ``saved`` (``[[dtype, shape], ...]``) does not fit ``mine``, or ``None``."""
    if not isinstance(saved, list) or len(saved) != len(mine):
        count = len(saved) if isinstance(saved, list) else "no"
        return (f"Stanza.state: rank {rank}'s {what} state holds {count} variables, its "
                f"{what} has {len(mine)}")
    for i, (a, b) in enumerate(zip(saved, mine)):
        if a != b:
            return (f"Stanza.state: rank {rank}'s {what} variable {i} ({names[i]}) "
                    f"was saved as {a[0]} {tuple(a[1])}, this trainer's is {b[0]} "
                    f"{tuple(b[1])}")
    return None
