"""The specs of the low-precision compressions: ``int8(chunk=1024)`` and ``sign()``
(``hvd.Compression.int8(chunk=256)``, ``HVDX_COMPRESSION="int8(chunk=256)"``).

Each spec is a :class:`hvdx.compression_registry.UserCompression` with its own
catalogue name, so the synchronizer of registered compressors runs it, with error
feedback, through the shared compression drivers; what it adds is only its name, its
title and its compressor (:mod:`.core_int8`, :mod:`.core_sign`). Framework-neutral.
"""

from __future__ import annotations

from typing import ClassVar

from hvdx.compression_registry import UserCompression
from hvdx.strategies.low_precision.core_int8 import DEFAULT_CHUNK, Int8Compressor
from hvdx.strategies.low_precision.core_sign import SignCompressor

__all__ = ["Int8Compression", "SignCompression", "int8", "sign"]


class Int8Compression(UserCompression):
    """8-bit min-max quantisation per chunk with error feedback
    (:class:`~hvdx.strategies.low_precision.core_int8.Int8Compressor`)."""

    name: ClassVar[str] = "int8"
    title: ClassVar[str] = "8-bit quantisation"

    def __init__(self, chunk: int = DEFAULT_CHUNK):
        super().__init__("int8", Int8Compressor, (), {"chunk": chunk})


class SignCompression(UserCompression):
    """1-bit sign with a per-tensor scale, with error feedback
    (:class:`~hvdx.strategies.low_precision.core_sign.SignCompressor`)."""

    name: ClassVar[str] = "sign"
    title: ClassVar[str] = "1-bit sign compression"

    def __init__(self):
        super().__init__("sign", SignCompressor)


def int8(chunk: int = DEFAULT_CHUNK) -> Int8Compression:
    """``compression=int8(chunk)``: each chunk of ``chunk`` entries (an integer >= 1) as
    its min, its max and one byte per entry, with error feedback. A bad ``chunk`` is a
    ``ValueError`` naming it (kept for every rank in a job of several)."""
    return Int8Compression(chunk)


def sign() -> SignCompression:
    """``compression=sign()``: the signs of the gradient, one bit each, scaled by its
    mean magnitude, with error feedback."""
    return SignCompression()


# compression=hvd.Compression.int8 (not called) is refused by this mark
# (hvdx.strategy_contract.strategy_of), as TopK's.
int8.hvdx_builds = "compression"
sign.hvdx_builds = "compression"
