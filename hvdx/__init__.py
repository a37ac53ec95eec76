"""hvdx: network-aware synchronization for Horovod.

Change one line of a Horovod script::

    import hvdx.torch as hvd          # was: import horovod.torch as hvd

and everything works as before, bit for bit. hvdx's strategies are then switched on
through the optimizer's ``compression=`` and ``sync=`` arguments (the strategy
contract: :mod:`hvdx.strategy_contract`).

Framework adapters: :mod:`hvdx.torch`, :mod:`hvdx.tensorflow`,
:mod:`hvdx.tensorflow.keras`. Framework-neutral algorithms: :mod:`hvdx.core`.
"""

from hvdx._version import __version__
from hvdx.compression_registry import register_compressor
from hvdx.core.compression_protocol import Compressor
from hvdx.mixer_registry import Mixer, mixer, register_mixer
from hvdx.strategies import catalogue as _catalogue
# Each built-in synchronization strategy's constructor, as the catalogue lists them
# (StrategyDescriptor.exports("hvdx")), written out so that grep and IDEs find them; a
# test checks that each is bound to the catalogue's path.
from hvdx.strategies.dssync.spec import DSSync
from hvdx.strategies.decentralized.spec import Decentralized

# Any other name the catalogue exports here (a new strategy's, not written out above)
# is loaded by its lazy path when first asked for (PEP 562).
__getattr__, __dir__ = _catalogue.module_exports(__name__, "hvdx")

__all__ = sorted({"Compressor", "Mixer", "__version__", "mixer", "register_compressor",
                  "register_mixer"} |
                 set(_catalogue.exports("hvdx")))
