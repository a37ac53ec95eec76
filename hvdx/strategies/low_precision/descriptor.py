"""The low-precision compressions' entries in the strategy catalogue
(:data:`hvdx.strategies.catalogue.BUILT_IN`).

Both run on the shared compression drivers over the registered compressors'
synchronizer (their specs are :class:`hvdx.compression_registry.UserCompression`), so
their checkpoint state is that of a registered compressor. Neither has a bench row, a
soak, a cost layout or a line of ``hvdx plan`` yet. Importing this module imports no
framework.
"""

from hvdx.strategies.descriptor import Constructor, StrategyDescriptor

__all__ = ["INT8", "SIGN"]

#: The synchronizer of every registered compressor, which runs these specs too.
_SYNCHRONIZER = "hvdx.mpi.user_compression_exchange:UserCompressionSynchronizer"

INT8 = StrategyDescriptor(
    name="int8", kind="compression", title="8-bit quantisation",
    constructors=(Constructor("int8", "hvdx.strategies.low_precision.spec:int8"),),
    synchronizer=_SYNCHRONIZER,
    examples=("int8(chunk=256)",))

SIGN = StrategyDescriptor(
    name="sign", kind="compression", title="1-bit sign compression",
    constructors=(Constructor("sign", "hvdx.strategies.low_precision.spec:sign"),),
    synchronizer=_SYNCHRONIZER,
    examples=("sign()",))
