"""``hvdx.torch.Compression``: Horovod's compressors plus :meth:`Compression.topk` and
the compressors registered with ``hvdx.register_compressor``."""

from __future__ import annotations

import horovod.torch as _hvd

from hvdx.compression_registry import Registered
from hvdx.strategies.topk.spec import TopKCompression, topk as _topk

__all__ = ["Compression", "TopKCompression"]


class Compression(_hvd.Compression, metaclass=Registered):
    """Optional gradient compression.

    ``none`` and ``fp16`` are Horovod's own compressors (the same objects). ``topk``
    builds a :class:`~hvdx.strategies.topk.spec.TopKCompression`: bidirectional TopK with error
    feedback, which :func:`hvdx.torch.DistributedOptimizer` runs with hvdx's own
    synchronization (mpi4py collectives), because an allreduce cannot carry TopK::

        compression=hvd.Compression.topk(ratio=0.01, downlink_ratio=0.01)

    ``Compression.<name>(...)`` builds a compressor registered under ``name``
    (:func:`hvdx.register_compressor`), run with error feedback by
    :mod:`hvdx.torch.compression_driver`.
    """

    topk = staticmethod(_topk)
