"""The low-precision compressors written out in numpy, independently of hvdx: the
reference of tests/mpi/torch/test_torch_low_precision.py and
tests/mpi/tensorflow/test_tf_low_precision.py (each rank's round trip; the tests add the
error feedback and the average over the ranks)."""

import numpy as np


def int8_round_trip(x, chunk=4):
    """Min-max quantisation of each chunk of ``chunk`` entries, and back."""
    flat, out = x.reshape(-1).astype(np.float64), np.empty(x.size)
    for start in range(0, x.size, chunk):
        piece = flat[start:start + chunk]
        lo, hi = np.float64(np.float32(piece.min())), np.float64(np.float32(piece.max()))
        q = np.round((piece - lo) / (hi - lo) * 255) if hi > lo else np.zeros(piece.size)
        out[start:start + chunk] = lo + q * (hi - lo) / 255
    return out.reshape(x.shape).astype(np.float32)


def sign_round_trip(x):
    """The signs (0 counts as +), scaled by the mean magnitude as float32."""
    return (np.where(x < 0, -1.0, 1.0) *
            np.float32(np.abs(x).mean(dtype=np.float64))).astype(np.float32)
