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

Every compression strategy, built-in or registered, is run by one driver per framework
(:mod:`hvdx.torch.compression_driver`, :mod:`hvdx.tensorflow.compression_driver`), over
the strategy's *synchronizer*: the composition of its three parts across ranks
(mpi4py), which its catalogue entry names (``synchronizer``). A synchronizer has
:data:`SYNCHRONIZER_METHODS` and :data:`SYNCHRONIZER_ATTRIBUTES`; the drivers hand it
flat numpy views of the gradients and write back what it returns.
:class:`hvdx.mpi.user_compression_exchange.UserCompressionSynchronizer` composes a
registered :class:`Compressor` with its memory and an ``allgather`` or ``allreduce``
communicator; :class:`hvdx.strategies.topk.mpi_driver.TopKSynchronizer` is TopK's, with
the capabilities the drivers offer (:data:`DRIVER_CAPABILITIES`).

Numpy and the standard library only.
"""

from __future__ import annotations

from typing import ClassVar, Dict, List, Sequence, Tuple

import numpy as np

__all__ = ["COMMUNICATORS", "Compressor", "DRIVER_CAPABILITIES", "MEMORIES",
           "SYNCHRONIZER_ATTRIBUTES", "SYNCHRONIZER_METHODS", "TOPK_COMMUNICATORS",
           "check_compressor_class", "missing_from_synchronizer"]

#: The memories a compressor may declare.
MEMORIES = ("residual", "none")
#: The communicators a registered compressor may declare.
COMMUNICATORS = ("allgather", "allreduce")
#: Built-in TopK's own communicators (sparse pairs, downlink compression).
TOPK_COMMUNICATORS = ("gathered", "sharded")


#: What a compression driver calls on a synchronizer:
#:
#: - ``for_spec(names, spec, comm, sum_op, labels, shapes)`` (a classmethod): the
#:   synchronizer of one run, the tensors in a fixed order (the same on every rank);
#: - ``synchronize(sizes, flat, start_dense, first_bad, force_dense, itemsizes,
#:   joined, out)``: one step, collective. ``flat(position)`` is a tensor's gradient as
#:   a flat array, ``first_bad`` this rank's first tensor with NaN or Inf
#:   (``len(sizes)``: none). ``start_dense(positions)`` starts Horovod's allreduce of the
#:   tensors the synchronizer leaves dense and returns a callable that waits for it (or
#:   ``None``). It returns ``{position: flat result}``, or ``None`` on every rank when
#:   some rank's gradient was not finite (then nothing in it changed, and the driver
#:   makes every gradient NaN, as Horovod's allreduce would have);
#: - ``joined_step(sizes, agree_first)``: the step of the others, for a rank that has
#:   joined (``hvd.join()``); ``True`` once every rank has;
#: - ``overlaps_dense()``: whether every step from now on is Horovod's allreduce alone
#:   (the driver may then start it during the backward pass);
#: - ``state_dict()``, ``check_state_dict(state)``, ``load_state_dict(state)``,
#:   ``empty_state()`` and ``check_saved_rank(state, rank)`` (static): the checkpoint,
#:   its arrays in the entries ``ARRAY_ENTRIES`` names;
#: - ``shared_state()``, ``load_shared_state(state)``, ``holds_own_state()``: what a
#:   broadcast of the optimizer state gives every rank, and whether this rank keeps
#:   state of its own that it does not copy.
SYNCHRONIZER_METHODS = ("for_spec", "synchronize", "joined_step", "overlaps_dense",
                        "state_dict", "check_state_dict", "load_state_dict",
                        "empty_state", "check_saved_rank", "shared_state",
                        "load_shared_state", "holds_own_state")
#: Class attributes: ``STATE_KEY`` (its key in a torch ``optimizer.state_dict()``),
#: ``TENSORFLOW_ATTRIBUTE`` (a Keras optimizer's attribute that holds its state),
#: ``ARRAY_ENTRIES``, ``KEEPS_FLOAT64`` (float64 gradients are handed over in float64,
#: else float32), ``STATS`` (its counters' class, :class:`hvdx.core.counters.Counters`),
#: ``RESIDUALS`` (what a broadcast's note says each rank keeps); and per instance
#: ``names``, ``step``, ``stats``, ``comm`` and ``mode`` (the communicator's name).
SYNCHRONIZER_ATTRIBUTES = ("STATE_KEY", "TENSORFLOW_ATTRIBUTE", "ARRAY_ENTRIES",
                           "KEEPS_FLOAT64", "STATS", "RESIDUALS")
#: What the drivers offer a synchronizer beyond the protocol, and what asks for it:
#:
#: - ``"dense_allreduce"``: the tensors ``synchronize`` passes to ``start_dense`` go
#:   through Horovod's allreduce (op, ``gradient_predivide_factor``, process set), and
#:   once ``overlaps_dense()`` is true every allreduce starts from the backward pass's
#:   hooks (torch); a synchronizer that leaves nothing dense never uses it;
#: - ``"momentum_correction"``: the spec's ``momentum_correction`` is true (DGC, torch's
#:   SGD): the driver compresses each tensor's local velocity, and the synchronizer
#:   then also has ``check_finite(first_bad)``, ``split(sizes, force_dense)`` and
#:   ``last_sent`` (the entries each tensor sent, for the velocity's masking).
DRIVER_CAPABILITIES = ("dense_allreduce", "momentum_correction")


def missing_from_synchronizer(cls: type) -> List[str]:
    """The methods and class attributes of the protocol that ``cls`` lacks."""
    return [name for name in SYNCHRONIZER_METHODS + SYNCHRONIZER_ATTRIBUTES
            if not hasattr(cls, name)]


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
