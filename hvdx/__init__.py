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
from hvdx.mixer_registry import Mixer, mixer, register_mixer
from hvdx.strategies.catalogue import BUILT_IN as _BUILT_IN
from hvdx.strategies.descriptor import load as _load

# Each built-in synchronization strategy's constructor (DSSync, Decentralized), as the
# catalogue lists them (StrategyDescriptor.exports): a new strategy adds no line here.
_STRATEGIES = {_name: _load(_path) for _entry in _BUILT_IN
               for _name, _path in _entry.exports("hvdx")}
globals().update(_STRATEGIES)

__all__ = sorted(["Mixer", "__version__", "mixer", "register_compressor",
                  "register_mixer", *_STRATEGIES])
