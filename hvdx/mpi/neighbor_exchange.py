"""Neighbour exchange: one fused buffer to the out-neighbours, mixed with the in-neighbours'.

Decentralized SGD (Ying et al., "Exponential Graph is Provably Efficient for
Decentralized Deep Training", arXiv 2110.13363) mixes every rank's parameters with its
in-neighbours' at every step, ``x_i <- w_ii x_i + sum_j w_ij x_j``. The framework
adapter packs the whole model into ONE contiguous 1-D numpy buffer per step (one message
per neighbour instead of one per tensor) and :class:`NeighborExchange` moves it with
mpi4py non-blocking point-to-point on hvdx's duplicated communicator:

1. ``start(buffer, send_to, recv_from)``: check the arguments (before any
   communication), post one ``Isend`` of ``buffer`` per destination, then one ``Irecv``
   per source into receive buffers the exchange owns (allocated once and reused every
   step). Sends go first: a model-sized swap between two ranks (each the other's source
   and destination) posted receives first often ran one direction after the other, and
   took up to twice as long; a small message that arrives before its receive is posted
   costs one copy out of MPI's unexpected-message queue, next to nothing.
2. ``test()`` (optional, any number of times): ``MPI_Testall``, to move the messages
   while the caller computes (see "Progress" below).
3. ``finish(self_weight, recv_weights, out)``: wait for every request, check that each
   source sent as many bytes as this rank sends, and return
   ``self_weight * buffer + sum_j recv_weights[j] * recv_j`` in the buffer's dtype,
   self first and then the sources in the order given to ``start``: every rank that
   holds the same inputs rounds alike. ``finish_change(recv_weights, out)`` returns the
   change instead, ``sum_j w_j (recv_j - buffer)``, for an adapter that adds it to
   tensors that moved since ``start``.

The adapter decides when: it starts the exchange as soon as the local update is ready
and finishes it before the parameters are next read.

Matching: MPI matches messages with the same (communicator, source, tag) in the order
they were posted, so a peer that is both a source and a destination (a ring at n = 2, a
hypercube), or that appears twice in a list, is fine. Two exchanges in flight on the
same communicator at the same time must use different tags.

Progress: MPICH has no asynchronous progress thread by default. A small message goes
out eagerly inside ``Isend``; a large one (rendezvous protocol) moves only while some
MPI call on *both* processes polls, so an exchange that is started and then left alone
until ``finish()`` does most of its work inside ``finish()``. ``test()`` is cheap
enough to call from framework hooks (a forward pre-hook, a gradient hook) to keep the
transfer going during computation; ``MPIR_CVAR_ASYNC_PROGRESS=1`` gives MPICH a
progress thread instead (at the cost of a core spinning).

Waiting: ``finish()`` and ``cancel()`` test for 2 ms, yielding the core between tests
(a large message moves in chunks, each needing a test on both ends), then sleep
``HVDX_MPI_POLL_US`` microseconds between tests, like :func:`hvdx.mpi.sparse.wait`, so
that a rank that waits for a late peer does not take the core from it;
``HVDX_MPI_POLL_US=0`` spins in ``MPI_Waitall``.

Example::

    nx = NeighborExchange(comm)
    nx.start(flat, send_to=[(r + 1) % n], recv_from=[(r - 1) % n])
    ...                         # compute; nx.test() now and then
    nx.finish(0.5, [0.5], out=flat)
"""

from __future__ import annotations

import math
import operator
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from hvdx.core.counters import Counters
from hvdx.mpi import sparse, timeline

__all__ = ["DEFAULT_TAG", "ExchangeStats", "FusedExchange", "NeighborExchange",
           "consensus_distance", "exchange"]

#: Tag of an exchange when none is given ("NX"); hvdx's own communicator only.
DEFAULT_TAG = 0x4E58

# float32 and float64 travel as themselves; MPI has no standard half-precision type,
# so float16 travels as its bytes (the receiver reinterprets them: same dtype on both
# ends is part of the contract).
_MPI_TYPES = {
    np.dtype(np.float64): MPI.DOUBLE,
    np.dtype(np.float32): MPI.FLOAT,
    np.dtype(np.float16): None,
}


class ExchangeStats(Counters):
    """What this rank's exchanges moved (payload bytes only: no envelopes).

    ``bytes_sent``, ``last_bytes_sent``, ``messages_sent`` and ``exchanges`` are counted
    when :meth:`NeighborExchange.start` hands the messages to MPI (every one of them is
    completed later, by ``finish()`` or ``cancel()``); ``bytes_received`` when they
    arrive. ``allocations`` counts receive buffers allocated: constant in steady state.
    """

    INITIAL = {"bytes_sent": 0, "bytes_received": 0, "last_bytes_sent": 0,
               "messages_sent": 0, "exchanges": 0, "allocations": 0}
    __slots__ = tuple(INITIAL)

    def record_sent(self, nbytes: int, messages: int) -> None:
        """Count one exchange that hands ``messages`` messages of ``nbytes`` bytes in all
        to MPI: add to ``bytes_sent``, ``messages_sent`` and ``exchanges``, and set
        ``last_bytes_sent``."""
        self.bytes_sent += nbytes
        self.last_bytes_sent = nbytes
        self.messages_sent += messages
        self.exchanges += 1

    def record_received(self, nbytes: int) -> None:
        """Count ``nbytes`` bytes that arrived."""
        self.bytes_received += nbytes

    def record_allocation(self) -> None:
        """Count one receive buffer allocated."""
        self.allocations += 1


class NeighborExchange:
    """Non-blocking exchange of one fused buffer with a rank's neighbours (module docstring).

    One exchange at a time per object; not thread-safe.

    Args:
        comm: the communicator (hvdx's duplicate, :func:`hvdx.mpi.comm.world`); ranks in
            ``send_to`` / ``recv_from`` are ranks of ``comm``.
        tag: the MPI tag of every message; two objects with exchanges in flight at the
            same time on one communicator need different tags.
    """

    def __init__(self, comm: MPI.Comm, tag: int = DEFAULT_TAG):
        tag = operator.index(tag)
        upper = comm.Get_attr(MPI.TAG_UB)
        if not 0 <= tag <= upper:
            raise ValueError(f"tag={tag} must be in [0, {upper}] (MPI_TAG_UB)")
        self.comm = comm
        self.tag = tag
        self.stats = ExchangeStats()
        # Receive buffers: a pool for one (size, dtype), grown to the largest number of
        # sources seen, so that a schedule whose in-degree changes from step to step
        # (one-peer exponential vs static) does not allocate in steady state either.
        self._pool_key: Optional[Tuple[int, np.dtype]] = None
        self._pool: List[np.ndarray] = []
        self._pool_specs: List[list] = []
        # The exchange in flight.
        self._buffer: Optional[np.ndarray] = None
        self._sources: Tuple[int, ...] = ()
        self._requests: List[MPI.Request] = []
        self._statuses: List[MPI.Status] = []
        self._complete = False
        self._began = 0  # timeline.now() at start(), while a timeline records

    @property
    def pending(self) -> bool:
        """Whether an exchange was started and not yet finished or cancelled."""
        return self._buffer is not None

    def start(self, buffer: np.ndarray, send_to: Sequence[int],
              recv_from: Sequence[int]) -> None:
        """Post the sends of ``buffer`` to ``send_to`` and the receives from ``recv_from``.

        Args:
            buffer: 1-D, C-contiguous float16/32/64 array (native byte order): this
                rank's values. The exchange keeps a reference; do not modify it until
                :meth:`finish` or :meth:`cancel` returns. Every source must send a
                buffer of the same size and dtype.
            send_to: destination ranks (a rank may appear more than once).
            recv_from: source ranks, in the order :meth:`finish` sums them.

        Raises:
            RuntimeError: if an exchange is already pending (nothing is posted).
            ValueError: on a bad ``buffer`` or an out-of-range rank, before any
                communication.
        """
        if self.pending:
            raise RuntimeError("hvdx.NeighborExchange: an exchange is already pending; "
                               "finish() or cancel() it before start()")
        _check_buffer(buffer)
        size = self.comm.Get_size()
        destinations = _check_ranks("send_to", send_to, size)
        sources = _check_ranks("recv_from", recv_from, size)

        receive = self._receive_buffers(buffer, len(sources))
        send_spec = _spec(buffer)
        self._began = timeline.now() if timeline.active else 0
        # Sends first (step 1): a swap of 5.4 MB through an emulated 20 Mbit uplink, two
        # pairs across it, took 4.6-5.4 s in 20 of 20 rounds posted this way, and
        # 4.7-9.0 s (median 6.3) posted receives first: then one direction often waited
        # for the other to finish (MPICH over UCX's TCP transport).
        sends = [self.comm.Isend(send_spec, dest=dest, tag=self.tag)
                 for dest in destinations]
        # Held receives first all the same: _release pairs the first statuses with the
        # sources.
        requests = [self.comm.Irecv(receive[k], source=source, tag=self.tag)
                    for k, source in enumerate(sources)] + sends

        self._buffer = buffer
        self._sources = sources
        self._requests = requests
        self._statuses = [MPI.Status() for _ in requests]
        self._complete = False
        sent = buffer.nbytes * len(destinations)
        self.stats.record_sent(sent, len(destinations))

    def test(self) -> bool:
        """Drive MPI progress once (``MPI_Testall``); True when the exchange is complete.

        Cheap: call it from hooks during computation. True when nothing is pending.
        """
        if not self.pending:
            return True
        if not self._complete:
            # Once complete, the requests are null and a second Testall would overwrite
            # the statuses (with empty ones) that finish() checks.
            self._complete = MPI.Request.Testall(self._requests, self._statuses)
        return self._complete

    def finish(self, self_weight: float, recv_weights: Sequence[float],
               out: Optional[np.ndarray] = None) -> np.ndarray:
        """Wait for the exchange and return ``self_weight * buffer + sum_j w_j recv_j``.

        Computed in the buffer's dtype: ``self_weight * buffer`` first, then each source's
        weighted values added in the order of ``recv_from``.

        Args:
            self_weight: ``w_ii``.
            recv_weights: ``w_ij``, one per entry of ``recv_from``, in the same order.
            out: where to write the result (same shape and dtype as ``buffer``, writable);
                may be ``buffer`` itself, whose sends are complete by then. A new array
                when None.

        Raises:
            RuntimeError: if no exchange is pending, or a source sent a buffer of another
                size.
            ValueError: on bad ``recv_weights`` or ``out``, before waiting; the exchange
                stays pending (call ``finish()`` again, or ``cancel()``).
        """
        if not self.pending:
            raise RuntimeError("hvdx.NeighborExchange: finish() without a pending exchange")
        buffer = self._buffer
        weights = self._check_finish(recv_weights, out)
        self._wait()
        received = self._release()

        result = out if out is not None else np.empty_like(buffer)
        np.multiply(buffer, buffer.dtype.type(self_weight), out=result)
        for values, weight in zip(received, weights):
            # The receive buffers are ours and the next start() overwrites them: scale
            # them in place instead of allocating a temporary for weight * values.
            np.multiply(values, values.dtype.type(weight), out=values)
            np.add(result, values, out=result)
        return result

    def finish_change(self, recv_weights: Sequence[float],
                      out: Optional[np.ndarray] = None) -> np.ndarray:
        """Wait for the exchange and return ``sum_j w_j (recv_j - buffer)``.

        The change the mix makes to ``buffer`` when ``self_weight = 1 - sum_j w_j`` (a
        doubly stochastic matrix's row): ``buffer + change`` is the mix. For an adapter
        that adds the change to tensors which moved since ``start`` (combine-then-adapt),
        this is two passes over the buffer per source instead of :meth:`finish`'s three
        and a subtraction. Arguments and errors as :meth:`finish`; ``out`` may not be
        ``buffer``.
        """
        if not self.pending:
            raise RuntimeError("hvdx.NeighborExchange: finish_change() without a pending "
                               "exchange")
        buffer = self._buffer
        weights = self._check_finish(recv_weights, out)
        if out is buffer:
            raise ValueError("out must not be the sent buffer: the change is relative "
                             "to it")
        self._wait()
        received = self._release()
        result = out if out is not None else np.empty_like(buffer)
        if not received:
            result.fill(0)
            return result
        for k, (values, weight) in enumerate(zip(received, weights)):
            target = result if k == 0 else values
            np.subtract(values, buffer, out=target)
            np.multiply(target, target.dtype.type(weight), out=target)
            if k:
                np.add(result, target, out=result)
        return result

    def cancel(self) -> None:
        """Complete the pending exchange, if any, and discard what it received.

        For error paths: MPI cannot reliably cancel a send, so this waits for every
        request (the peers have posted, or will post, the matching ones), leaving none
        pending.
        """
        if not self.pending:
            return
        self._wait()
        self._release()

    # --- internals --------------------------------------------------------------------

    def _check_finish(self, recv_weights, out) -> List[float]:
        buffer = self._buffer
        weights = [float(w) for w in recv_weights]
        if len(weights) != len(self._sources):
            raise ValueError(f"recv_weights has {len(weights)} weights but the exchange "
                             f"receives from {len(self._sources)} ranks {self._sources}")
        if out is not None:
            if not isinstance(out, np.ndarray) or out.shape != buffer.shape or \
                    out.dtype != buffer.dtype or not out.flags.writeable:
                raise ValueError(f"out must be a writable {buffer.dtype} array of shape "
                                 f"{buffer.shape}, got {_describe(out)}")
        return weights

    def _wait(self) -> None:
        if self._complete:
            return
        try:
            sparse.wait_all(self._requests, self._statuses)  # spin-then-sleep
        except MPI.Exception:
            # An MPI error (e.g. a truncated message) leaves nothing to wait for here.
            self._clear()
            raise
        self._complete = True

    def _release(self) -> List[np.ndarray]:
        """Count and check the received bytes, end the exchange; the receive buffers."""
        expected = self._buffer.nbytes
        received = self._pool[:len(self._sources)]
        total = 0
        for source, status in zip(self._sources, self._statuses):
            count = status.Get_count(MPI.BYTE)
            self.stats.record_received(count)
            total += count
            if count != expected:
                self._clear()
                raise RuntimeError(
                    f"hvdx.NeighborExchange: rank {source} sent {count} bytes, this rank "
                    f"expected {expected} (same buffer size and dtype on every rank)")
        if self._began:
            # From start() to the last message's arrival: the exchange in flight.
            timeline.record("HVDX_NEIGHBOR_EXCHANGE", f"neighbors {self._buffer.dtype}",
                            self._began, self.stats.last_bytes_sent, total)
        self._clear()
        return received

    def _clear(self) -> None:
        self._began = 0
        self._buffer = None
        self._sources = ()
        self._requests = []
        self._statuses = []
        self._complete = False

    def _receive_buffers(self, buffer: np.ndarray, count: int) -> List[list]:
        """MPI buffer specs of ``count`` receive buffers like ``buffer`` (allocated once)."""
        key = (buffer.size, buffer.dtype)
        if key != self._pool_key:
            self._pool_key = key
            self._pool, self._pool_specs = [], []
        while len(self._pool) < count:
            values = np.empty_like(buffer)
            self._pool.append(values)
            self._pool_specs.append(_spec(values))
            self.stats.record_allocation()
        return self._pool_specs[:count]


def exchange(comm: MPI.Comm, buffer: np.ndarray, send_to: Sequence[int],
             recv_from: Sequence[int], self_weight: float, recv_weights: Sequence[float],
             out: Optional[np.ndarray] = None, tag: int = DEFAULT_TAG) -> np.ndarray:
    """One blocking exchange: :meth:`NeighborExchange.start` then ``finish``.

    ``recv_weights`` is checked before any communication.
    """
    if len(recv_weights) != len(recv_from):
        raise ValueError(f"recv_weights has {len(recv_weights)} weights but recv_from "
                         f"has {len(recv_from)} ranks")
    nx = NeighborExchange(comm, tag)
    nx.start(buffer, send_to, recv_from)
    return nx.finish(self_weight, recv_weights, out=out)


def _spec(values: np.ndarray) -> list:
    """The mpi4py buffer spec of a checked array."""
    mpi_type = _MPI_TYPES[values.dtype]
    if mpi_type is None:
        return [values.view(np.uint8), MPI.BYTE]
    return [values, mpi_type]


def _check_buffer(buffer) -> None:
    if not isinstance(buffer, np.ndarray) or buffer.ndim != 1 or \
            not buffer.flags.c_contiguous or buffer.dtype not in _MPI_TYPES:
        raise ValueError("buffer must be a 1-D C-contiguous numpy array of float16, "
                         f"float32 or float64 (native byte order), got {_describe(buffer)}")


def _check_ranks(name: str, ranks: Sequence[int], size: int) -> Tuple[int, ...]:
    checked = []
    for rank in ranks:
        try:
            value = operator.index(rank)
        except TypeError:
            raise ValueError(f"{name}: rank {rank!r} is not an integer") from None
        if not 0 <= value < size:
            raise ValueError(f"{name}: rank {value} is out of range for a communicator "
                             f"of {size} ranks")
        checked.append(value)
    return tuple(checked)


def _describe(value) -> str:
    if isinstance(value, np.ndarray):
        layout = "contiguous" if value.flags.c_contiguous else "non-contiguous"
        return f"{value.dtype} array of shape {value.shape} ({layout})"
    return type(value).__name__


def consensus_distance(comm: MPI.Comm, x: np.ndarray) -> float:
    """``sqrt(mean_i ||x_i - mean_j x_j||^2)`` over the ranks of ``comm`` (collective):
    how far their models ``x`` (this rank's, flat float64) are apart."""
    n = comm.Get_size()
    x = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
    total = np.empty_like(x)
    comm.Allreduce(x, total)
    deviation = x - total / n
    return math.sqrt(comm.allreduce(float(np.dot(deviation, deviation))) / n)


class FusedExchange:
    """A whole model's neighbour exchange: one :class:`NeighborExchange` per dtype
    family of its fused layout (:mod:`hvdx.core.fused_layout`), shared by the torch and
    TensorFlow decentralized optimizers.

    1. :meth:`layout_for` (the tensors' ``(dtype name, count)``): the layout, with one
       host buffer per family for the adapter to pack into (``buffers``) and one for the
       result (``mixed``); rebuilt when the tensors change;
    2. :meth:`start`: every family's messages are posted before any is waited for;
    3. :meth:`finish`: the mix (or, with ``change``, the change ``sum_j w_j (x_j - x_i)``)
       of every family lands in ``mixed``; returns the bytes sent and the messages.

    Args:
        comm: hvdx's communicator.
        tags: the MPI tag of each family (``{np.dtype: int}``), distinct from every
            other exchange on ``comm``.
    """

    def __init__(self, comm: MPI.Comm, tags: Dict[np.dtype, int]):
        self.comm = comm
        self.tags = {np.dtype(family): tag for family, tag in tags.items()}
        self.layout = None
        self.buffers: Dict[np.dtype, np.ndarray] = {}
        self.mixed: Dict[np.dtype, np.ndarray] = {}
        self._exchanges: Dict[np.dtype, NeighborExchange] = {}
        self._messages = 0

    def layout_for(self, key):
        """The :class:`~hvdx.core.fused_layout.FusedLayout` of tensors ``key`` (built
        once; rebuilt, with new buffers, when the tensors change)."""
        from hvdx.core.fused_layout import FusedLayout

        key = tuple(key)
        if self.layout is None or key != self.layout.key:
            self.layout = FusedLayout(key)
            self.buffers = {f: np.empty(n, f) for f, n in self.layout.families.items()}
            self.mixed = {f: np.empty(n, f) for f, n in self.layout.families.items()}
            for family in self.layout.families:
                if family not in self._exchanges:
                    self._exchanges[family] = NeighborExchange(self.comm,
                                                               tag=self.tags[family])
        return self.layout

    def start(self, send_to: Sequence[int], recv_from: Sequence[int]) -> None:
        """Send every family's ``buffers`` to ``send_to``, receive from ``recv_from``."""
        for family, buffer in self.buffers.items():
            self._exchanges[family].start(buffer, send_to, recv_from)
        self._messages = len(send_to) * len(self.buffers)

    def test(self) -> None:
        """Let MPI move the messages (between two pieces of computation)."""
        for exchange in self._exchanges.values():
            exchange.test()

    def finish(self, self_weight: float, recv_weights: Sequence[float],
               change: bool = False) -> Tuple[int, int]:
        """Wait; ``mixed`` holds every family's mix (with ``change``, the change).

        Returns:
            ``(bytes sent, messages sent)`` over the families.
        """
        sent = 0
        for family, out in self.mixed.items():
            exchange = self._exchanges[family]
            if change:
                exchange.finish_change(recv_weights, out=out)
            else:
                exchange.finish(self_weight, recv_weights, out=out)
            sent += exchange.stats.last_bytes_sent
        return sent, self._messages
