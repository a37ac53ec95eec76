"""``hvdx.tensorflow.Compression``: Horovod's compressors plus :meth:`Compression.topk`
and the compressors registered with ``hvdx.register_compressor``."""

from __future__ import annotations

import functools

import horovod.tensorflow as _hvd
import tensorflow as tf

from hvdx.compression_registry import Registered
from hvdx.strategies.topk.presets import WITHOUT_MOMENTUM_CORRECTION
from hvdx.strategies.topk.spec import TopKCompression, topk as _topk

__all__ = ["Compression", "TopKCompression"]


# hvdx.strategies.topk.spec.topk (its name, docstring and signature), whose presets leave DGC's
# momentum correction off unless it is given (WITHOUT_MOMENTUM_CORRECTION).
@functools.wraps(_topk)
def _tensorflow_topk(*args, preset=None, **kwargs):
    if preset is not None:
        kwargs = dict(WITHOUT_MOMENTUM_CORRECTION, **kwargs)
    return _topk(*args, preset=preset, **kwargs)


class _Registered(Registered):
    """Registered compressors' builders, left unconverted by AutoGraph as ``topk`` is
    (a spec is often built inside a ``tf.function``, next to the tape)."""

    def __getattr__(cls, name):
        return tf.autograph.experimental.do_not_convert(super().__getattr__(name))


class Compression(_hvd.Compression, metaclass=_Registered):
    """Optional gradient compression (TensorFlow and Keras).

    ``none`` and ``fp16`` are Horovod's own compressors (the same objects). ``topk``
    builds a :class:`~hvdx.strategies.topk.spec.TopKCompression`: bidirectional TopK with error
    feedback, which :func:`hvdx.tensorflow.DistributedGradientTape` and
    :func:`hvdx.tensorflow.keras.DistributedOptimizer` run with hvdx's own
    synchronization (see :mod:`hvdx.strategies.topk.tensorflow.adapters`)::

        compression=hvd.Compression.topk(ratio=0.01, downlink_ratio=0.01)

    ``topk(preset="fast")`` / ``"safe"`` run the presets of :mod:`hvdx.strategies.topk.presets`
    without DGC's momentum correction, which is implemented for PyTorch's SGD only.

    ``Compression.<name>(...)`` builds a compressor registered under ``name``
    (:func:`hvdx.register_compressor`), run with error feedback by
    :mod:`hvdx.tensorflow.user_compression`.
    """

    # Scripts often build the spec inside a tf.function (next to the tape): AutoGraph
    # would convert hvdx's plain-Python validation, which is slow and was seen to fail
    # intermittently inside AutoGraph's converted code, so it is left unconverted.
    topk = staticmethod(tf.autograph.experimental.do_not_convert(_tensorflow_topk))


# Refused uncalled, as the neutral topk (hvdx.strategy.strategy_of).
Compression.topk.hvdx_builds = _topk.hvdx_builds
