"""``hvdx.tensorflow.keras.load_model``: Horovod's, wrapping with hvdx's optimizer.

Horovod's ``load_model`` rebuilds the saved model's optimizer wrapped in *Horovod's*
``DistributedOptimizer``. Under an hvdx strategy that would leave the loading rank on
Horovod's gradient allreduce while the others run the strategy (Horovod's Keras resume
recipe loads on rank 0 alone, or on every rank): the ranks would wait in different
collectives. This one wraps with :func:`hvdx.tensorflow.keras.DistributedOptimizer`, so
the loaded optimizer runs what the script's other optimizers run: the strategy passed
here, or the one ``HVDX_COMPRESSION`` / ``HVDX_SYNC`` name, or, with neither, Horovod's
own optimizer, as Horovod's ``load_model`` gives it.
"""

import horovod._keras as _impl
import horovod.tensorflow.keras as _hvd_keras
from horovod.tensorflow import Compression

from hvdx.tensorflow.keras.optimizer import DistributedOptimizer

__all__ = ["load_model"]


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, legacy_opts=False, sync=None):
    """Load a saved Keras model with its optimizer wrapped by hvdx (collective when the
    strategy's optimizer is).

    Takes the arguments of ``horovod.tensorflow.keras.load_model``, plus ``sync=`` (as
    :func:`~hvdx.tensorflow.keras.DistributedOptimizer`'s).
    """
    def wrap_optimizer(cls):
        return lambda **kwargs: DistributedOptimizer(cls(**kwargs), compression=compression,
                                                     sync=sync)
    return _impl.load_model(_hvd_keras.keras, wrap_optimizer, filepath, custom_optimizers,
                            custom_objects, legacy_opts)
