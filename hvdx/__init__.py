"""hvdx: network-aware synchronization for Horovod.

Change one line of a Horovod script::

    import hvdx.torch as hvd          # was: import horovod.torch as hvd

and everything works as before, bit for bit. hvdx's strategies are then switched on
through the optimizer's ``compression=`` and ``sync=`` arguments (the strategy
contract: :mod:`hvdx.strategy`).

Framework adapters: :mod:`hvdx.torch`, :mod:`hvdx.tensorflow`,
:mod:`hvdx.tensorflow.keras`. Framework-neutral algorithms: :mod:`hvdx.core`.
"""

from hvdx._version import __version__
from hvdx.compression_registry import register_compressor
from hvdx.core.compression_protocol import Compressor
from hvdx.mixer_registry import Mixer, mixer, register_mixer
# Each built-in synchronization strategy's constructor, as the catalogue lists them
# (StrategyDescriptor.exports("hvdx")); a test checks that these names are the
# catalogue's.
from hvdx.strategies.dssync.spec import DSSync
from hvdx.strategies.decentralized.spec import Decentralized

__all__ = ["Compressor", "DSSync", "Decentralized", "Mixer", "__version__", "mixer",
           "register_compressor", "register_mixer"]
