"""The :class:`~hvdx.strategy.Job` that TensorFlow entry points resolve strategies for."""

import horovod.tensorflow as _hvd

from hvdx.strategy import Job

__all__ = ["job"]


def job(compression, process_set) -> Job:
    """This rank's job as Horovod's TensorFlow module sees it."""
    return Job(size=_hvd.size(), rank=_hvd.rank(), horovod=_hvd, compression=compression,
               no_compression=_hvd.Compression.none, process_set=process_set,
               framework="tensorflow")
