"""Drop-in replacement for ``horovod.tensorflow.keras``.

``import hvdx.tensorflow.keras as hvd`` gives every public name of
``horovod.tensorflow.keras`` (``callbacks``, ``broadcast_global_variables``, ...)
unchanged, except :func:`init` (job-wide abort on an uncaught exception) and
:func:`DistributedOptimizer`, which accepts every Horovod argument plus ``sync=`` and
checks on its first gradient aggregation that all ranks agree on the variables and
settings, ``Compression``, which adds ``topk`` to Horovod's compressors (TopK with
error feedback, :mod:`hvdx.tensorflow.compression_driver`), :func:`load_model`, which wraps
the loaded optimizer with hvdx's, and :func:`shutdown`, :func:`start_timeline` and
:func:`stop_timeline`, which add hvdx's exchanges to Horovod's timeline file once it is
closed. With no hvdx feature switched on, the optimizer is
Horovod's own.
"""

from hvdx._horovod import import_framework

import_framework("tensorflow")

from horovod.tensorflow.keras import *  # noqa: E402,F401,F403
from horovod.tensorflow.keras import callbacks, elastic  # noqa: E402,F401

from hvdx.tensorflow.compression import Compression  # noqa: E402,F401

from hvdx.tensorflow.runtime import init, shutdown, start_timeline, stop_timeline  # noqa: E402,F401,E501
from hvdx.tensorflow.keras.optimizer import DistributedOptimizer  # noqa: E402,F401
from hvdx.tensorflow.keras.loading import load_model  # noqa: E402,F401
from hvdx.strategies.dssync.mixer import dssync_process_sets  # noqa: E402,F401
from hvdx.tensorflow.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402,F401
from hvdx.strategies.decentralized.spec import Decentralized  # noqa: E402,F401
from hvdx.strategies.dssync.spec import DSSync  # noqa: E402,F401
