"""The one protocol of every compression strategy: GRACE's three parts.

A compression strategy (Xu et al., "GRACE: A Compressed Communication Framework for
Distributed Machine Learning", ICDCS 2021) is the composition of:

1. a *compressor* (:class:`Compressor`): what a gradient becomes on the wire,
   ``compress(x, step, name) -> payloads`` and back, ``decompress(payloads, ...)``,
   numpy only;
2. a *memory* (:data:`MEMORIES`): what the compressor left out and when it is sent.
   ``"residual"``: error feedback (Seide et al., Interspeech 2014; Karimireddy et al.,
   ICML 2019): ``corrected = grad + residual``, ``residual <- corrected -
   decompress(compress(corrected))``. ``"none"``: the compressor's error is lost (an
   unbiased compressor, or a measurement of what error feedback buys);
3. a *communicator* (:data:`COMMUNICATORS`): how every rank's payloads travel and
   combine. ``"allgather"``: every rank receives every rank's payloads, of any number,
   shape and dtype, and averages their decompressions (the general case).
   ``"allreduce"``: the payloads are summed where they lie (one allreduce), then
   decompressed once: for a compressor whose payloads have the same shapes and dtypes
   on every rank and whose ``decompress`` is linear in them (a random-k drawn from a
   shared seed, a cast to a narrower float, PowerSGD's factors), which sends
   ``2 (n - 1) / n`` payloads per rank instead of ``n - 1``.

A registered compressor declares its memory and communicator as class attributes
(:attr:`Compressor.memory`, :attr:`Compressor.communicator`); ``hvdx.register_compressor``
refuses (:func:`check_compressor_class`) a class that lacks ``compress`` or
``decompress`` or names a part hvdx does not have, naming the method or attribute.

Built-in TopK is such a composition with capabilities of its own, which the protocol
names: its compressor is the top-``k`` selection (:mod:`hvdx.strategies.topk.core_selection`,
layer-wise or global), its memory the worker residual with DGC's momentum correction
(:mod:`hvdx.strategies.topk.core_error_feedback`), and its communicators
(:data:`TOPK_COMMUNICATORS`) carry (index, value) pairs and compress the downlink too,
with a server residual: ``"gathered"`` (one allgather; every rank aggregates) and
``"sharded"`` (alltoall to the shard owners, then allgather).

Numpy and the standard library only.
"""

from __future__ import annotations

from typing import ClassVar, Dict, List, Sequence, Tuple

import numpy as np

__all__ = ["COMMUNICATORS", "Compressor", "MEMORIES", "TOPK_COMMUNICATORS",
           "check_compressor_class"]

#: The memories a compressor may declare.
MEMORIES = ("residual", "none")
#: The communicators a registered compressor may declare.
COMMUNICATORS = ("allgather", "allreduce")
#: Built-in TopK's own communicators (sparse pairs, downlink compression).
TOPK_COMMUNICATORS = ("gathered", "sharded")


class Compressor:
    """Subclass this, then ``hvdx.register_compressor("name", YourCompressor)``.

    The constructor takes the arguments of ``hvd.Compression.<name>(...)`` (and of
    ``HVDX_COMPRESSION=<name>(...)``); raise ``ValueError`` naming a bad one. Every rank
    builds its own instance, so keep any randomness seeded from :meth:`settings` and the
    ``step`` and ``name`` arguments, never from the rank.
    """

    #: The memory (module docstring): ``"residual"`` (error feedback) or ``"none"``.
    memory: ClassVar[str] = "residual"
    #: The communicator (module docstring): ``"allgather"`` or ``"allreduce"``.
    communicator: ClassVar[str] = "allgather"

    def compress(self, x: np.ndarray, step: int, name: str) -> List[np.ndarray]:
        """``x`` (the error-corrected gradient, in the tensor's shape) as payloads."""
        raise NotImplementedError

    def decompress(self, payloads: Sequence[np.ndarray], shape: Tuple[int, ...],
                   dtype: np.dtype, step: int, name: str) -> np.ndarray:
        """An array of ``shape`` and ``dtype`` from one rank's ``payloads`` (with the
        ``"allreduce"`` communicator: from their sum over the ranks)."""
        raise NotImplementedError

    def settings(self) -> Dict[str, object]:
        """Everything every rank must share (ratios, seeds): compared across ranks
        before the first step, as ``repr`` of the sorted items."""
        return {}


def check_compressor_class(cls: type) -> None:
    """Refuse, with ``TypeError`` naming the method or attribute, a compressor class
    that lacks ``compress`` or ``decompress`` or declares a memory or communicator hvdx
    does not have (before any rank starts a collective: at registration)."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    for method in ("compress", "decompress"):
        if getattr(cls, method) is getattr(Compressor, method):
            raise TypeError(f"compressor_class={name} does not implement {method}(...): "
                            "a compressor implements compress(x, step, name) and "
                            "decompress(payloads, shape, dtype, step, name)")
    if cls.memory not in MEMORIES:
        raise TypeError(f"compressor_class={name}: memory={cls.memory!r} must be one of "
                        f"{MEMORIES}")
    if cls.communicator not in COMMUNICATORS:
        raise TypeError(f"compressor_class={name}: communicator={cls.communicator!r} must "
                        f"be one of {COMMUNICATORS}")
