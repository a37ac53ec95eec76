"""Low precision with error feedback: two built-in compression strategies that send
every entry of the gradient at fewer bits, the rest carried by the residual.

One folder, one algorithm per file (the shared machinery stays in hvdx.core and
hvdx.mpi):

- ``core_int8.py``: ``int8``, 8-bit min-max quantisation per chunk (Bagua's ByteGrad);
- ``core_sign.py``: ``sign``, one bit per entry and a per-tensor scale (EF-SignSGD);
- ``spec.py``: the constructors ``int8(chunk=1024)`` and ``sign()`` and their specs,
  run by the registered compressors' synchronizer
  (:class:`hvdx.mpi.user_compression_exchange.UserCompressionSynchronizer`), with error
  feedback (:mod:`hvdx.core.user_compression`);
- ``descriptor.py``: their entries in the catalogue (:mod:`hvdx.strategies.catalogue`).

Importing this package imports nothing else.
"""
