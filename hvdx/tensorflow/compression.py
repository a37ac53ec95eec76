"""``hvdx.tensorflow.Compression``: Horovod's compressors plus :meth:`Compression.topk`."""

from __future__ import annotations

import horovod.tensorflow as _hvd
import tensorflow as tf

from hvdx.compression import TopKCompression, topk as _topk

__all__ = ["Compression", "TopKCompression"]


class Compression(_hvd.Compression):
    """Optional gradient compression (TensorFlow and Keras).

    ``none`` and ``fp16`` are Horovod's own compressors (the same objects). ``topk``
    builds a :class:`~hvdx.compression.TopKCompression`: bidirectional TopK with error
    feedback, which :func:`hvdx.tensorflow.DistributedGradientTape` and
    :func:`hvdx.tensorflow.keras.DistributedOptimizer` run with hvdx's own
    synchronization (see :mod:`hvdx.tensorflow.topk`)::

        compression=hvd.Compression.topk(ratio=0.01, downlink_ratio=0.01)
    """

    # Scripts often build the spec inside a tf.function (next to the tape): AutoGraph
    # would convert hvdx's plain-Python validation, which is slow and was seen to fail
    # intermittently inside AutoGraph's converted code, so it is left unconverted.
    topk = staticmethod(tf.autograph.experimental.do_not_convert(_topk))
