"""``hvdx.tensorflow.Compression``: Horovod's compressors plus the built-in compression
strategies' constructors (``Compression.topk``), as the catalogue lists them, and the
compressors registered with ``hvdx.register_compressor``.

``Compression.<name>`` is looked up, in order:

1. Horovod's own compressors (``none``, ``fp16``), attributes of the class;
2. a built-in compression strategy's constructor called ``name``
   (:func:`hvdx.compression_registry.built_in_constructor`), with its entry's
   ``tensorflow_arguments`` applied to the keyword arguments where it has one, built
   once per constructor;
3. a compressor registered under ``name``.

Each is left unconverted by AutoGraph: scripts often build the spec inside a
``tf.function`` (next to the tape), and AutoGraph would convert hvdx's plain-Python
validation, which is slow and was seen to fail intermittently inside its converted
code.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import horovod.tensorflow as _hvd
import tensorflow as tf

from hvdx.compression_registry import Registered, built_in_constructor
from hvdx.strategies import catalogue
from hvdx.strategies.descriptor import VARIABLES, load

__all__ = ["Compression"]


@functools.lru_cache(maxsize=None)
def _tensorflow_constructor(build: str, arguments: Optional[str]) -> Callable:
    """The constructor at the lazy path ``build`` as TensorFlow's ``Compression`` gives
    it: its keyword arguments passed through ``arguments`` (a lazy path too) where
    given, unconverted by AutoGraph; its name, docstring and signature are the
    constructor's. Cached: ``Compression.<name>`` is the same object at every look-up,
    as a class attribute is."""
    neutral = load(build)
    constructor = neutral
    if arguments is not None:
        fitted = load(arguments)

        @functools.wraps(neutral)
        def constructor(*args, **kwargs):
            return neutral(*args, **fitted(kwargs))
    converted = tf.autograph.experimental.do_not_convert(constructor)
    builds = getattr(neutral, "hvdx_builds", None)
    if builds is not None:  # refused uncalled, as the neutral one (hvdx.strategy_contract.strategy_of)
        converted.hvdx_builds = builds
    return converted


class _Registered(Registered):
    """The built-in compressors' constructors as TensorFlow runs them, and registered
    compressors' builders, each left unconverted by AutoGraph."""

    def __getattr__(cls, name):
        found = None if name.startswith("_") else built_in_constructor(name)
        if found is not None:
            constructor, entry = found
            return _tensorflow_constructor(constructor.build, entry.tensorflow_arguments)
        return tf.autograph.experimental.do_not_convert(super().__getattr__(name))

    def __dir__(cls):
        built_in = catalogue.environment_constructors(VARIABLES["compression"],
                                                      built_in_only=True)
        return sorted(set(super().__dir__()) | {
            name for name, (constructor, _) in built_in.items()
            if isinstance(constructor.build, str)})  # (a preset is no attribute)


class Compression(_hvd.Compression, metaclass=_Registered):
    """Optional gradient compression (TensorFlow and Keras).

    ``none`` and ``fp16`` are Horovod's own compressors (the same objects). ``topk``
    builds a :class:`~hvdx.strategies.topk.spec.TopKCompression`: bidirectional TopK with error
    feedback, which :func:`hvdx.tensorflow.DistributedGradientTape` and
    :func:`hvdx.tensorflow.keras.DistributedOptimizer` run with hvdx's own
    synchronization (see :mod:`hvdx.tensorflow.compression_driver`)::

        compression=hvd.Compression.topk(ratio=0.01, downlink_ratio=0.01)

    ``topk(preset="fast")`` / ``"safe"`` run the presets of :mod:`hvdx.strategies.topk.presets`
    without DGC's momentum correction, which is implemented for PyTorch's SGD only.

    ``Compression.<name>(...)`` builds a compressor registered under ``name``
    (:func:`hvdx.register_compressor`), run with error feedback by
    :mod:`hvdx.tensorflow.compression_driver`.
    """
