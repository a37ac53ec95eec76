"""The PyTorch optimizer for bidirectional TopK with error feedback.

Zou, De Sterck & Liu, "Downlink Compression Improves TopK Sparsification", arXiv
2209.15203. The math (selection, residuals, aggregation, downlink) is
:mod:`hvdx.core.bidirectional_topk`; the pair collectives are :mod:`hvdx.mpi.sparse`.
This module only moves tensors between torch and numpy and calls them in order.

One :meth:`step` (``synchronize`` then the wrapped optimizer's ``step``):

1. take every parameter's gradient in the optimizer's ``param_groups`` order (the order
   the fingerprint checked, the same on every rank); a missing gradient is zeros, as in
   Horovod, because another rank may have one;
2. check all gradients for NaN/Inf and combine the result across ranks with one tiny
   allgather, so every rank raises the same ``ValueError`` naming the first bad
   parameter, before any residual changes;
3. tensors with fewer than ``min_size`` entries, sparse gradients, and every tensor
   during ``warmup_steps``: Horovod's allreduce (op, ``gradient_predivide_factor``);
4. the others, all together: flatten each to float32 numpy on CPU and run
   :func:`~hvdx.core.bidirectional_topk.uplink` with its worker residual (selection stays
   layer-wise: each tensor keeps its own ``k``), then exchange the pairs of all tensors at
   once in one flat index space (tensor ``t`` shifted by its offset in the concatenation,
   in the fixed order): ``gathered`` (one Allgatherv; every rank aggregates and runs the
   downlink of each tensor with its replica of the server residual) or ``sharded`` (each
   tensor keeps its own shards; one Alltoallv carries all tensors' pieces to the shard
   owners, which aggregate their shards, run the downlink with their shard of the server
   residual, and one Allgatherv returns the results). A step thus costs a fixed number of
   collectives (each with its small exchange of counts) whatever the number of tensors,
   and the result is bitwise the per-tensor one. ``m`` is the average over ranks
   (``op=Sum`` multiplies by the size). With ``error_feedback=False`` no residual is
   kept (plain TopK);
5. write the dense update ``u`` into ``p.grad`` (original device and dtype);
6. the wrapped optimizer's ``step``.

Notes:
    - Residuals hold gradients, not ``lr * g``.
    - ``backward_passes_per_step``: gradients accumulate in ``p.grad`` between steps
      (call ``step`` once per N passes); the sum is what is compressed, as Horovod
      allreduces the sum.
    - Sparse gradients (``torch.sparse``) are densified and averaged by Horovod, then made
      sparse again.
    - Global TopK selection across tensors is not implemented: each tensor keeps its own
      ``ratio``.
"""

from __future__ import annotations

import contextlib
from typing import Dict, List, Tuple

import numpy as np
import horovod.torch as _hvd
import torch

from hvdx.compression import TopKCompression
from hvdx.core.bidirectional_topk import (aggregate, downlink, select, selection_rng,
                                          to_dense, uplink)
from hvdx.core.error_feedback import ResidualMemory
from hvdx.core.sharding import shard_bounds, shard_k, split_by_shard
from hvdx.mpi.sparse import allgatherv_pairs, alltoallv_pairs
from hvdx.torch.wrapping import subclass_of

__all__ = ["TopKStats", "make_topk_optimizer", "STATE_KEY"]

#: The key of hvdx's state in :meth:`state_dict`.
STATE_KEY = "hvdx_topk"

#: The most entries one fused exchange covers: its indices must fit in int32.
_GROUP_LIMIT = 2 ** 31

_OP_NAMES = {_hvd.Average: "Average", _hvd.Sum: "Sum", _hvd.Adasum: "Adasum",
             _hvd.Min: "Min", _hvd.Max: "Max", _hvd.Product: "Product"}


class TopKStats:
    """Bytes this rank handed to MPI (``sent``) and got from it (``received``).

    ``last_*``: the last step; ``total_*``: since construction. Sparse exchanges count
    the buffers given to mpi4py (pairs and counts); Horovod's dense allreduce is counted
    as a ring allreduce, ``2 (P - 1) / P`` times the tensor's bytes each way.
    """

    __slots__ = ("last_sent", "last_received", "total_sent", "total_received",
                 "last_sparse_tensors", "last_dense_tensors", "steps")

    def __init__(self):
        self.last_sent = self.last_received = 0.0
        self.total_sent = self.total_received = 0.0
        self.last_sparse_tensors = self.last_dense_tensors = 0
        self.steps = 0

    def _begin(self):
        self.last_sent = self.last_received = 0.0
        self.last_sparse_tensors = self.last_dense_tensors = 0

    def _add(self, sent, received):
        self.last_sent += sent
        self.last_received += received
        self.total_sent += sent
        self.total_received += received

    def as_dict(self) -> Dict[str, float]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self):
        return f"TopKStats({self.as_dict()})"


def make_topk_optimizer(optimizer, named_parameters, compression: TopKCompression,
                        backward_passes_per_step, op, gradient_predivide_factor,
                        sparse_as_dense, process_set, comm):
    """An instance of a class made at run time from ``optimizer``'s class.

    ``isinstance(result, type(optimizer))`` holds. The base class is captured in the new
    class (``_hvdx_base``), never found through ``super(self.__class__, self)``, so
    subclassing the result does not recurse.
    """
    if op not in (_hvd.Average, _hvd.Sum):
        raise ValueError(f"op={_OP_NAMES.get(op, op)} is not supported with TopK "
                         "compression; use op=hvd.Average or op=hvd.Sum")
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if gradient_predivide_factor != 1.0 and op != _hvd.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    cls = subclass_of(optimizer, _TopKOptimizer)
    return cls(optimizer.param_groups, named_parameters, compression,
               backward_passes_per_step, op, gradient_predivide_factor, sparse_as_dense,
               process_set, comm)


class _TopKOptimizer:
    """Methods copied into the run-time class; ``self._hvdx_base`` is the user's class."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step,
                 op, gradient_predivide_factor, sparse_as_dense, process_set, comm):
        self._hvdx_base.__init__(self, params)
        names = {}
        if named_parameters is not None:
            names = {id(p): n for n, p in named_parameters}
        entries = []
        for g, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                if p.requires_grad:
                    entries.append((names.get(id(p), f"param_groups[{g}][{i}]"), p))
        seen = [n for n, _ in entries]
        duplicates = sorted({n for n in seen if seen.count(n) > 1})
        if duplicates:
            raise ValueError(f"parameter names must be unique, found duplicates: {duplicates}")
        self._hvdx_entries: List[Tuple[str, torch.Tensor]] = entries
        self._hvdx_compression = compression
        self._hvdx_comm = comm
        self._hvdx_size = comm.Get_size()
        self._hvdx_rank = comm.Get_rank()
        self._hvdx_mode = compression.resolve_mode(self._hvdx_size)
        self._hvdx_op = op
        self._hvdx_predivide = gradient_predivide_factor
        self._hvdx_sparse_as_dense = sparse_as_dense
        self._hvdx_process_set = process_set
        self.backward_passes_per_step = backward_passes_per_step
        self._hvdx_worker = ResidualMemory([n for n, _ in entries])
        self._hvdx_server = ResidualMemory([n for n, _ in entries])
        self._hvdx_step = 0
        self._hvdx_synchronized = False
        self._hvdx_should_synchronize = True
        self.hvdx_stats = TopKStats()

    # --- the public surface of Horovod's optimizer -----------------------------------

    def set_backward_passes_per_step(self, passes):
        if passes <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = passes

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside, :meth:`step` does not synchronize (call :meth:`synchronize` first)."""
        self._hvdx_should_synchronize = False
        try:
            yield
        finally:
            self._hvdx_should_synchronize = True

    def step(self, closure=None):
        if self._hvdx_should_synchronize and not self._hvdx_synchronized:
            self.synchronize()
        self._hvdx_synchronized = False
        return self._hvdx_base.step(self, closure)

    def synchronize(self):
        """Replace every ``p.grad`` by the TopK-compressed average (steps 1 to 5)."""
        grads = []
        for name, p in self._hvdx_entries:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        self._hvdx_check_finite(grads)
        stats = self.hvdx_stats
        stats._begin()
        compression = self._hvdx_compression
        warm = self._hvdx_step < compression.warmup_steps
        dense, sparse = [], []
        for position, ((name, p), g) in enumerate(zip(self._hvdx_entries, grads)):
            if warm or g.is_sparse or g.numel() < compression.min_size:
                dense.append((name, p))
            else:
                sparse.append((position, name, p))
        handles = [self._hvdx_dense_async(name, p) for name, p in dense]
        self._hvdx_sparse_all(sparse)
        for (name, p), (handle, was_sparse) in zip(dense, handles):
            out = _hvd.synchronize(handle)
            if was_sparse:
                p.grad = out.to_sparse()
        stats.last_sparse_tensors, stats.last_dense_tensors = len(sparse), len(dense)
        stats.steps += 1
        self._hvdx_step += 1
        self._hvdx_synchronized = True

    # --- state ----------------------------------------------------------------------

    def state_dict(self):
        state = self._hvdx_base.state_dict(self)
        state[STATE_KEY] = {
            "step": self._hvdx_step,
            "mode": self._hvdx_mode,
            "size": self._hvdx_size,
            "rank": self._hvdx_rank,
            "worker": {n: torch.from_numpy(e) for n, e in self._hvdx_worker.state_dict().items()},
            "server": {n: torch.from_numpy(e) for n, e in self._hvdx_server.state_dict().items()},
        }
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        topk = state_dict.pop(STATE_KEY, None)
        self._hvdx_base.load_state_dict(self, state_dict)
        if topk is None:
            return
        if topk["server"] and (topk["mode"], topk["size"]) != (self._hvdx_mode, self._hvdx_size):
            raise ValueError(
                f"the checkpoint's TopK server residuals are for mode={topk['mode']} on "
                f"{topk['size']} ranks, this optimizer runs mode={self._hvdx_mode} on "
                f"{self._hvdx_size}")
        self._hvdx_worker.load_state_dict(
            {n: _to_numpy(t) for n, t in topk["worker"].items()})
        self._hvdx_server.load_state_dict(
            {n: _to_numpy(t) for n, t in topk["server"].items()})
        self._hvdx_step = int(topk["step"])

    # --- internals ------------------------------------------------------------------

    def _hvdx_check_finite(self, grads):
        first = len(grads)
        for i, g in enumerate(grads):
            values = g.coalesce().values() if g.is_sparse else g
            if not bool(torch.isfinite(values).all()):
                first = i
                break
        everyone = self._hvdx_comm.allgather(first)
        worst = min(everyone)
        if worst == len(grads):
            return
        name = self._hvdx_entries[worst][0]
        ranks = [r for r, i in enumerate(everyone) if i == worst]
        raise ValueError(
            f"hvdx TopK: gradient of parameter '{name}' has NaN or Inf values on rank(s) "
            f"{ranks}; no residual was changed and no parameter was updated")

    def _hvdx_dense_async(self, name, p):
        """Horovod's allreduce of ``p.grad`` (in place when dense)."""
        g = p.grad
        was_sparse = g.is_sparse
        if was_sparse:
            g = g.to_dense()
            p.grad = g
        op, prescale, postscale = self._hvdx_op, 1.0, 1.0
        if op == _hvd.Average and self._hvdx_predivide != 1.0:
            prescale = 1.0 / self._hvdx_predivide
            postscale = self._hvdx_predivide
        handle = _hvd.allreduce_async_(g, name=f"hvdx.topk.dense.{name}", op=op,
                                       prescale_factor=prescale, postscale_factor=postscale,
                                       process_set=self._hvdx_process_set)
        size = self._hvdx_size
        nbytes = 2 * (size - 1) / size * g.numel() * g.element_size()
        self.hvdx_stats._add(nbytes, nbytes)
        return handle, was_sparse

    def _hvdx_sparse_all(self, sparse):
        """Steps 4 and 5 for every compressed tensor, fused into a fixed number of collectives.

        The tensors share one flat index space: tensor ``t`` occupies
        ``[offsets[t], offsets[t] + d_t)`` in the fixed parameter order, so the pairs of all
        tensors travel in one buffer and each rank's received pairs are cut back per tensor
        by ``searchsorted`` on the offsets. Selection, aggregation (rank order) and the
        downlink stay per tensor, so the result is bitwise the per-tensor one. Tensors are
        grouped so that every group's index space fits in int32 (one group in practice).
        """
        start, total = 0, 0
        for i, (_, _, p) in enumerate(sparse):
            d = p.numel()
            if i > start and total + d > _GROUP_LIMIT:
                self._hvdx_sparse_group(sparse[start:i])
                start, total = i, 0
            total += d
        if sparse:
            self._hvdx_sparse_group(sparse[start:])

    def _hvdx_sparse_group(self, group):
        compression = self._hvdx_compression
        config = compression.config
        feedback = compression.error_feedback
        size, rank, step = self._hvdx_size, self._hvdx_rank, self._hvdx_step
        threshold = config.selector == "threshold"

        def rng(role, index, position):
            if not threshold:
                return None
            return selection_rng(config.seed, step, role, index, position)

        sizes = [p.numel() for _, _, p in group]
        offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        ups = []
        for (position, name, p), d in zip(group, sizes):
            flat = p.grad.detach().reshape(-1).to("cpu", torch.float32).numpy()
            if feedback:
                ups.append(uplink(self._hvdx_worker, name, flat, config.k_up(d), config,
                                  rng("up", rank, position)))
            else:
                ups.append(select(flat, config.k_up(d), config, rng("up", rank, position)))
        if self._hvdx_mode == "gathered":
            updates = self._hvdx_gathered(group, sizes, offsets, ups, rng)
        else:
            updates = self._hvdx_sharded(group, sizes, offsets, ups, rng)
        for (_, _, p), u in zip(group, updates):
            if self._hvdx_op == _hvd.Sum:
                u = u * np.float32(size)
            with torch.no_grad():
                p.grad.copy_(torch.from_numpy(u).view(p.grad.shape))

    def _hvdx_gathered(self, group, sizes, offsets, ups, rng):
        """One Allgatherv of every tensor's pairs; every rank aggregates and runs the downlink."""
        config, size = self._hvdx_compression.config, self._hvdx_size
        feedback = self._hvdx_compression.error_feedback
        indices = np.concatenate([i.astype(np.int64) + offsets[t]
                                  for t, (i, _) in enumerate(ups)])
        values = np.concatenate([v for _, v in ups])
        gathered, sent, received = allgatherv_pairs(self._hvdx_comm, indices, values)
        self.hvdx_stats._add(sent, received)
        cuts = [np.searchsorted(i, offsets) for i, _ in gathered]
        updates = []
        for t, ((position, name, _), d) in enumerate(zip(group, sizes)):
            pieces = [(i[c[t]:c[t + 1]], v[c[t]:c[t + 1]]) for (i, v), c in zip(gathered, cuts)]
            m = aggregate(pieces, d, size, offset=offsets[t], dtype=np.float32)
            k_down = config.k_down(d)
            if k_down is None:
                updates.append(m)
                continue
            server = self._hvdx_server.get(name) if feedback else None
            u_indices, u_values, residual = downlink(m, server, k_down, config,
                                                     rng("down", 0, position))
            if feedback:
                self._hvdx_server.set(name, residual)
            updates.append(to_dense(u_indices, u_values, d))
        return updates

    def _hvdx_sharded(self, group, sizes, offsets, ups, rng):
        """One Alltoallv of the pairs to the shard owners, one Allgatherv of their picks.

        Every tensor keeps its own shards (:func:`~hvdx.core.sharding.shard_bounds` of its
        length); what one rank sends an owner is all tensors' pieces for it, in order.
        """
        config, size, rank = self._hvdx_compression.config, self._hvdx_size, self._hvdx_rank
        feedback = self._hvdx_compression.error_feedback
        all_bounds = [shard_bounds(d, size) for d in sizes]
        outgoing = [[] for _ in range(size)]
        for t, ((indices, values), bounds) in enumerate(zip(ups, all_bounds)):
            for owner, (i, v) in enumerate(split_by_shard(indices, values, bounds)):
                outgoing[owner].append((i.astype(np.int64) + offsets[t], v))
        pieces = [(np.concatenate([i for i, _ in out]), np.concatenate([v for _, v in out]))
                  for out in outgoing]
        incoming, sent, received = alltoallv_pairs(self._hvdx_comm, pieces)
        self.hvdx_stats._add(sent, received)
        cuts = [np.searchsorted(i, offsets) for i, _ in incoming]
        chosen = []
        for t, ((position, name, _), d, bounds) in enumerate(zip(group, sizes, all_bounds)):
            lo, hi = int(bounds[rank]), int(bounds[rank + 1])
            mine = [(i[c[t]:c[t + 1]], v[c[t]:c[t + 1]]) for (i, v), c in zip(incoming, cuts)]
            m_s = aggregate(mine, hi - lo, size, offset=offsets[t] + lo, dtype=np.float32)
            k_down = config.k_down(d)
            if k_down is None:
                local = np.flatnonzero(m_s)
                chosen.append((local + (offsets[t] + lo), m_s[local]))
                continue
            share = int(shard_k(k_down, bounds)[rank])
            server = self._hvdx_server.get(name) if feedback else None
            local, values, residual = downlink(m_s, server, share, config,
                                               rng("down", rank, position))
            if feedback:
                self._hvdx_server.set(name, residual)
            chosen.append((local + (offsets[t] + lo), values))
        selected, sent, received = allgatherv_pairs(
            self._hvdx_comm, np.concatenate([i for i, _ in chosen]),
            np.concatenate([v for _, v in chosen]))
        self.hvdx_stats._add(sent, received)
        cuts = [np.searchsorted(i, offsets) for i, _ in selected]
        updates = []
        for t, d in enumerate(sizes):
            indices = np.concatenate([i[c[t]:c[t + 1]] for (i, _), c in zip(selected, cuts)])
            values = np.concatenate([v[c[t]:c[t + 1]] for (_, v), c in zip(selected, cuts)])
            updates.append(to_dense(indices.astype(np.int64) - offsets[t], values, d))
        return updates


def _to_numpy(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu").numpy().copy()
    return np.asarray(t).copy()
