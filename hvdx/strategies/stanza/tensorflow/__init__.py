"""Stanza's TensorFlow adapter.

hvdx.tensorflow is imported first, here: it re-exports names of the catalogue's
strategies (:meth:`hvdx.strategies.descriptor.StrategyDescriptor.exports`), and the
modules of this package build on its own, so a module of this package imported on its
own finds hvdx.tensorflow whole, as it did when it lived in hvdx/tensorflow/.
"""

import hvdx.tensorflow  # noqa: F401
