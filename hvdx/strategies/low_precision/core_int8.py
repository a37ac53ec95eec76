"""8-bit min-max quantisation per chunk: Bagua's ByteGrad (Gan et al., "Bagua: Scaling
up Distributed Learning with System Relaxations", VLDB 2022), run with error feedback
(:mod:`hvdx.core.user_compression`).

Numpy and the standard library only.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from hvdx.core.compression_protocol import Compressor
from hvdx.core.validation import check_integer

__all__ = ["DEFAULT_CHUNK", "LEVELS", "Int8Compressor"]

#: Entries per chunk when ``chunk`` is not given.
DEFAULT_CHUNK = 1024
#: The largest code: a chunk's range is cut into 255 steps.
LEVELS = 255


class Int8Compressor(Compressor):
    """Each chunk of the flat gradient as its minimum, its maximum and one byte per
    entry.

    Compress ``x`` (the error-corrected gradient):

    1. flatten ``x`` and cut it into chunks of ``chunk`` entries (the last may be
       shorter);
    2. per chunk, ``lo = min`` and ``hi = max``, both as float32;
    3. per entry, the code ``q = round((x - lo) / (hi - lo) * 255)``, a uint8 (a
       constant chunk, ``hi == lo``: every code 0);
    4. payloads: ``[lo of every chunk, hi of every chunk, every code]``.

    Decompress: ``lo + q * (hi - lo) / 255`` per entry, so each entry is off by at most
    half a step, ``(hi - lo) / 510``; what is off stays in the residual.

    The mins and maxes differ per rank, so payloads cannot be summed: the communicator
    is ``"allgather"``. The arithmetic is done in float64 (a float32 gradient's error
    stays within the bound up to the final rounding to float32).

    Args:
        chunk: entries per chunk, an integer >= 1; smaller chunks follow the gradient's
            range more closely and send 8 bytes more per chunk.
    """

    memory = "residual"
    communicator = "allgather"

    def __init__(self, chunk: int = DEFAULT_CHUNK):
        self.chunk = check_integer("chunk", chunk, 1)

    def settings(self) -> Dict[str, object]:
        return {"chunk": self.chunk}

    def _starts(self, size: int) -> np.ndarray:
        return np.arange(0, size, self.chunk)

    def compress(self, x: np.ndarray, step: int, name: str) -> List[np.ndarray]:
        flat = np.asarray(x).reshape(-1)
        if flat.size == 0:
            empty = np.zeros(0, np.float32)
            return [empty, empty, np.zeros(0, np.uint8)]
        starts = self._starts(flat.size)
        lo = np.minimum.reduceat(flat, starts).astype(np.float32)
        hi = np.maximum.reduceat(flat, starts).astype(np.float32)
        which = np.arange(flat.size) // self.chunk
        low = lo.astype(np.float64)[which]
        span = (hi.astype(np.float64) - lo.astype(np.float64))[which]
        # A constant chunk divides by one instead of zero: its codes are all 0.
        scaled = (flat.astype(np.float64) - low) / np.where(span > 0, span, 1.0) * LEVELS
        # Clipped: lo and hi rounded to float32 may sit just inside a float64 chunk.
        codes = np.clip(np.rint(scaled), 0, LEVELS).astype(np.uint8)
        return [lo, hi, codes]

    def decompress(self, payloads: Sequence[np.ndarray], shape: Tuple[int, ...],
                   dtype: np.dtype, step: int, name: str) -> np.ndarray:
        lo, hi, codes = (np.asarray(p) for p in payloads)
        size = int(np.prod(shape, dtype=np.int64))
        which = np.arange(size) // self.chunk
        low = lo.astype(np.float64)[which]
        step_size = ((hi.astype(np.float64) - lo.astype(np.float64)) / LEVELS)[which]
        out = low + codes.astype(np.float64) * step_size
        return out.astype(dtype).reshape(shape)
