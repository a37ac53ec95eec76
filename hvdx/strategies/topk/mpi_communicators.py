"""GRACE's communicators for TopK: the collectives that turn every rank's pairs into
the average (Xu et al., "GRACE: A Compressed Communication Framework for Distributed
Machine Learning", ICDCS 2021).

The two sparse exchanges share one interface, :meth:`Gathered.exchange` /
:meth:`Sharded.exchange`: given the step's uplink pairs of a group of tensors, in one
flat index space (tensor ``t`` shifted by ``offsets[t]``, in the fixed order), return
each tensor's update (the dense average, or a
:class:`~hvdx.strategies.topk.core_compressor.SparseUpdate`), bitwise what the
per-tensor step of :func:`~hvdx.strategies.topk.core_bidirectional.simulate_step`
gives. Where the average ``m`` is known they run the downlink with the compressor
(:mod:`hvdx.strategies.topk.core_compressor`) and the server memory
(:mod:`hvdx.strategies.topk.core_memory`):

- :class:`Gathered`: one Allgatherv of every rank's pairs; every rank aggregates each
  tensor (rank order) and runs its downlink with its replica of the server residual;
- :class:`Sharded`: every tensor keeps its own shards
  (:func:`~hvdx.core.sharding.shard_bounds` of its length); one Alltoallv carries all
  tensors' pieces to the shard owners, which aggregate their shards, agree on each
  shard's share of the global downlink TopK
  (:func:`~hvdx.strategies.topk.core_global.agree_shares`), select it with their
  shard of the server residual, and one Allgatherv returns the selections.

The third, :class:`SmallTensors`, is dense: one MPI allreduce of the float32
concatenation of the tensors below ``min_size`` (``small_tensors="in_topk_step"``). It
is started before the sparse exchange and completed after it, so that the two overlap:
its interface is ``start`` then the returned ``finish``.

Every collective shares a :class:`Wire`: the mpi4py communicator, the byte counters
(:class:`~hvdx.strategies.topk.core_counters.TopKStats`) and the row of Horovod's
timeline (:mod:`hvdx.mpi.timeline`) the spans go to.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from hvdx.core.sharding import shard_bounds, split_by_shard
from hvdx.mpi import timeline
from hvdx.mpi.sparse import allgatherv_floats, allgatherv_pairs, alltoallv_pairs, wait
from hvdx.strategies.topk.core_bidirectional import aggregate
from hvdx.strategies.topk.core_compressor import SparseUpdate, TopKCompressor
from hvdx.strategies.topk.core_counters import TopKStats
from hvdx.strategies.topk.core_global import agree_shares
from hvdx.strategies.topk.core_memory import TopKMemory

__all__ = ["Gathered", "Sharded", "SmallTensors", "Wire", "communicator_for"]

Pairs = Tuple[np.ndarray, np.ndarray]
#: ``(position, entries)`` of each tensor of a group, in the fixed order.
Group = Sequence[Tuple[int, int]]


class Wire:
    """What every collective of a TopK run shares.

    Attributes:
        comm: the mpi4py communicator; assignable (tests wrap it to count collectives).
        stats: the byte counters; assignable (a restored TensorFlow state hands its own).
        size, rank: the communicator's, read once.
        dry_run: inside an autotune dry run (its spans get a row of their own).
    """

    def __init__(self, comm, stats: TopKStats):
        self.comm, self.stats = comm, stats
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        self.dry_run = False

    @property
    def row(self) -> str:
        """This run's row in Horovod's timeline."""
        return "topk autotune dry run" if self.dry_run else "topk"

    def began(self) -> int:
        """The start of a span (microseconds), 0 while no timeline records."""
        return timeline.now() if timeline.active else 0

    def count(self, phase: str, span: str, began: int, sent, received) -> None:
        """Add a collective's bytes to ``phase``, and its span to the timeline."""
        self.stats.record(sent, received, phase)
        if began:
            timeline.record(span, self.row, began, sent, received)

    def count_dense(self, entries: Iterable[Tuple[int, int]]) -> None:
        """A ring allreduce of tensors of ``(entries, itemsize)``: ``2 (P - 1) / P`` of
        each tensor's bytes sent and received (what Horovod's moves)."""
        for d, itemsize in entries:
            nbytes = 2 * (self.size - 1) / self.size * d * itemsize
            self.stats.record(nbytes, nbytes, "dense")


def _tensor_pairs(pairs_by_rank: List[Pairs], offsets: np.ndarray, t: int,
         cuts: List[np.ndarray]) -> List[Pairs]:
    """Tensor ``t``'s pairs from every rank's, whose indices ascend through the flat
    index space (``cuts``: ``searchsorted`` of each rank's indices on ``offsets``)."""
    return [(i[c[t]:c[t + 1]], v[c[t]:c[t + 1]]) for (i, v), c in zip(pairs_by_rank, cuts)]


class Gathered:
    """Gathered mode: one Allgatherv of every tensor's pairs; every rank aggregates and
    runs the downlink."""

    def __init__(self, wire: Wire):
        self.wire = wire

    def exchange(self, group: Group, offsets: np.ndarray, ups: Sequence[Pairs],
                 compressor: TopKCompressor, memory: TopKMemory) -> list:
        """Each tensor's average (dense), or its downlink update (:class:`SparseUpdate`)."""
        wire = self.wire
        indices = np.concatenate([i.astype(np.int64) + offsets[t]
                                  for t, (i, _) in enumerate(ups)])
        values = np.concatenate([v for _, v in ups])
        began = wire.began()
        gathered, sent, received = allgatherv_pairs(wire.comm, indices, values)
        wire.count("up", "HVDX_TOPK_ALLGATHER", began, sent, received)
        cuts = [np.searchsorted(i, offsets) for i, _ in gathered]
        updates = []
        for t, (position, d) in enumerate(group):
            m = aggregate(_tensor_pairs(gathered, offsets, t, cuts), d, wire.size,
                          offset=offsets[t], dtype=np.float32)
            k_down = compressor.k_down(d)
            if k_down is None:
                updates.append(m)
                continue
            b = memory.compensate_down(position, m)
            u_indices, u_values, residual = compressor.compress_down(b, k_down, 0, position)
            memory.update_down(position, residual)
            updates.append(SparseUpdate(u_indices, u_values, d))
        return updates


class Sharded:
    """Sharded mode: one Alltoallv of the pairs to the shard owners, one Allgatherv of
    their selections (what one rank sends an owner is all tensors' pieces for it, in
    order)."""

    def __init__(self, wire: Wire):
        self.wire = wire

    def exchange(self, group: Group, offsets: np.ndarray, ups: Sequence[Pairs],
                 compressor: TopKCompressor, memory: TopKMemory) -> list:
        """Each tensor's update (:class:`SparseUpdate`)."""
        wire = self.wire
        size, rank = wire.size, wire.rank
        all_bounds = [shard_bounds(d, size) for _, d in group]
        outgoing = [[] for _ in range(size)]
        for t, ((indices, values), bounds) in enumerate(zip(ups, all_bounds)):
            for owner, (i, v) in enumerate(split_by_shard(indices, values, bounds)):
                outgoing[owner].append((i.astype(np.int64) + offsets[t], v))
        pieces = [(np.concatenate([i for i, _ in out]), np.concatenate([v for _, v in out]))
                  for out in outgoing]
        began = wire.began()
        incoming, sent, received = alltoallv_pairs(wire.comm, pieces)
        wire.count("up", "HVDX_TOPK_ALLTOALL", began, sent, received)
        cuts = [np.searchsorted(i, offsets) for i, _ in incoming]
        chosen, compensated = [], {}
        for t, ((position, d), bounds) in enumerate(zip(group, all_bounds)):
            lo, hi = int(bounds[rank]), int(bounds[rank + 1])
            m_s = aggregate(_tensor_pairs(incoming, offsets, t, cuts), hi - lo, size,
                            offset=offsets[t] + lo, dtype=np.float32)
            if compressor.k_down(d) is None:
                local = np.flatnonzero(m_s)
                chosen.append((local + (offsets[t] + lo), m_s[local]))
            else:
                compensated[t] = memory.compensate_down(position, m_s)
                chosen.append(None)  # selected below, once the shares are agreed
        if compensated:
            # The global top k_down of every tensor's b: this shard's share of each.
            order = sorted(compensated)
            shares = self._agree_shares([compensated[t] for t in order],
                                        [compressor.k_down(group[t][1]) for t in order])
            for t, share in zip(order, shares):
                position = group[t][0]
                lo = int(all_bounds[t][rank])
                local, values, residual = compressor.compress_down(
                    compensated[t], int(share), rank, position)
                memory.update_down(position, residual)
                chosen[t] = (local + (offsets[t] + lo), values)
        began = wire.began()
        selected, sent, received = allgatherv_pairs(
            wire.comm, np.concatenate([i for i, _ in chosen]),
            np.concatenate([v for _, v in chosen]))
        wire.count("down", "HVDX_TOPK_SHARD_ALLGATHER", began, sent, received)
        cuts = [np.searchsorted(i, offsets) for i, _ in selected]
        updates = []
        for t, (_, d) in enumerate(group):
            # Shards in rank order, each owner's picks ascending: the indices ascend.
            indices = np.concatenate([i[c[t]:c[t + 1]] for (i, _), c in zip(selected, cuts)])
            values = np.concatenate([v[c[t]:c[t + 1]] for (_, v), c in zip(selected, cuts)])
            updates.append(SparseUpdate(indices.astype(np.int64) - offsets[t], values, d))
        return updates

    def _agree_shares(self, compensated, ks) -> np.ndarray:
        """This shard's share of each tensor's global top ``k_down``
        (:func:`hvdx.strategies.topk.core_global.agree_shares`), its bytes counted as
        ``"agree"``."""
        wire = self.wire
        comm, others, rank, size = wire.comm, wire.size - 1, wire.rank, wire.size
        moved = [0, 0]

        def allgather(array):
            everyone = allgatherv_floats(comm, array)
            moved[0] += others * everyone[rank].nbytes
            moved[1] += sum(a.nbytes for r, a in enumerate(everyone) if r != rank)
            return everyone

        def allreduce(array):
            array = np.ascontiguousarray(array, np.int64)
            total = np.empty_like(array)
            wait(comm.Iallreduce(array, total))
            moved[0] += 2 * others * array.nbytes // max(size, 1)
            moved[1] += 2 * others * array.nbytes // max(size, 1)
            return total

        began = wire.began()
        shares = agree_shares(compensated, ks, rank, allgather, allreduce)
        wire.count("agree", "HVDX_TOPK_AGREE", began, moved[0], moved[1])
        return shares


def communicator_for(mode: str, wire: Wire):
    """The sparse communicator of ``mode`` (``"gathered"`` or ``"sharded"``)."""
    return Gathered(wire) if mode == "gathered" else Sharded(wire)


class SmallTensors:
    """``small_tensors="in_topk_step"``: the tensors below ``min_size`` of a compressed
    step, averaged (summed with ``op=Sum``) by one non-blocking MPI allreduce of their
    float32 concatenation, counted as Horovod's ring allreduce would be."""

    def __init__(self, wire: Wire, sum_op: bool):
        self.wire, self.sum_op = wire, sum_op

    def start(self, tensors: Group, flat: Callable[[int], np.ndarray]
              ) -> Optional[Callable[[], Dict[int, np.ndarray]]]:
        """Start the allreduce of the ``(position, size)`` tensors; return a callable
        that waits for it and returns ``{position: average}``, or ``None`` if there is
        nothing to average."""
        if not tensors:
            return None
        wire = self.wire
        send = np.concatenate([flat(p) for p, _ in tensors]).astype(np.float32, copy=False)
        total = np.empty_like(send)
        began = wire.began()
        request = wire.comm.Iallreduce(send, total)
        wire.count_dense((d, 4) for _, d in tensors)

        def finish():
            wait(request)
            if began:
                ring = 2 * (wire.size - 1) * send.nbytes // wire.size
                timeline.record("HVDX_TOPK_SMALL_ALLREDUCE", wire.row, began, ring, ring)
            if not self.sum_op:
                np.divide(total, np.float32(wire.size), out=total)
            cuts = np.cumsum([0] + [d for _, d in tensors])
            return {p: total[cuts[t]:cuts[t + 1]] for t, (p, _) in enumerate(tensors)}
        return finish
