"""One bit per entry and a per-tensor scale: EF-SignSGD (Karimireddy, Rebjock, Stich &
Jaggi, "Error Feedback Fixes SignSGD and other Gradient Compression Schemes", ICML
2019), the compressor of 1-bit Adam (Tang et al., ICML 2021), run with error feedback
(:mod:`hvdx.core.user_compression`).

Numpy and the standard library only.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from hvdx.core.compression_protocol import Compressor

__all__ = ["SignCompressor"]


class SignCompressor(Compressor):
    """The gradient as its signs, scaled by its mean magnitude.

    Compress ``x`` (the error-corrected gradient):

    1. flatten ``x``;
    2. one bit per entry, set where ``x < 0``, packed eight to a byte (``np.packbits``);
    3. the scale ``mean(|x|)``, as float32 (0 for an empty tensor);
    4. payloads: ``[the packed bits, the scale]``.

    Decompress: ``scale * (-1 where the bit is set, else +1)``. The scale makes the
    decompressed tensor as large as ``x`` in the l1 norm (the scaled sign of
    Karimireddy et al.); what it misses stays in the residual.

    The scales differ per rank, so payloads cannot be summed: the communicator is
    ``"allgather"``.
    """

    memory = "residual"
    communicator = "allgather"

    def settings(self) -> Dict[str, object]:
        return {}

    def compress(self, x: np.ndarray, step: int, name: str) -> List[np.ndarray]:
        flat = np.asarray(x).reshape(-1)
        scale = np.abs(flat).mean(dtype=np.float64) if flat.size else 0.0
        return [np.packbits(flat < 0), np.array(scale, np.float32)]

    def decompress(self, payloads: Sequence[np.ndarray], shape: Tuple[int, ...],
                   dtype: np.dtype, step: int, name: str) -> np.ndarray:
        packed, scale = (np.asarray(p) for p in payloads)
        size = int(np.prod(shape, dtype=np.int64))
        negative = np.unpackbits(packed, count=size).astype(bool)
        signs = np.where(negative, -1.0, 1.0)
        return (signs * np.float64(scale)).astype(dtype).reshape(shape)
