"""The PyTorch optimizer for a registered compressor (``hvdx.register_compressor``).

The algorithm is :mod:`hvdx.core.user_compression`, its step across ranks
:class:`hvdx.mpi.user_compression_exchange.UserCompressionSynchronizer` (shared with
TensorFlow); this module moves gradients between torch and numpy. One :meth:`step`
(``synchronize`` then the wrapped optimizer's ``step``):

1. every parameter's gradient in the optimizer's ``param_groups`` order (the order the
   fingerprint checked); a missing gradient is zeros, a sparse one is made dense;
2. the synchronizer's step on CPU numpy copies (float64 stays float64, anything else
   is float32): error feedback, one exchange, the average (``op=Sum``: the sum);
3. the result is written into ``p.grad`` (its device and dtype; sparse again where it
   was); if some rank's gradient was not finite, every ``p.grad`` becomes NaN and no
   residual changes (what ``torch.amp.GradScaler`` expects of Horovod's allreduce);
4. the wrapped optimizer's ``step``.

The residuals and the step counter are in ``optimizer.state_dict()`` under
``"hvdx_user_compression"``; each rank's are its own (``hvd.save_checkpoint`` keeps
every rank's in one file).
"""

from __future__ import annotations

from typing import List, Tuple

import horovod.torch as _hvd
import numpy as np
import torch

from hvdx.compression_registry import UserCompression
from hvdx.mpi.user_compression_exchange import UserCompressionSynchronizer
from hvdx.torch.compressing_optimizer import CompressingOptimizer
from hvdx.torch.optimizer_state import say_once_per_job
from hvdx.torch.wrapping import subclass_of

__all__ = ["STATE_KEY", "adapter", "make_user_compression_optimizer"]

#: The key of hvdx's state in :meth:`state_dict`.
STATE_KEY = "hvdx_user_compression"


def make_user_compression_optimizer(optimizer, named_parameters,
                                    compression: UserCompression,
                                    backward_passes_per_step, op,
                                    gradient_predivide_factor, comm):
    """An instance of a class made at run time from ``optimizer``'s class
    (``isinstance(result, type(optimizer))`` holds); the arguments passed the spec's
    job checks (:meth:`hvdx.strategy_contract.CompressionStrategy.prepare`)."""
    cls = subclass_of(optimizer, _UserCompressionOptimizer)
    return cls(optimizer.param_groups, named_parameters, compression,
               backward_passes_per_step, op == _hvd.Sum, comm)


class _UserCompressionOptimizer(CompressingOptimizer):
    """Methods copied into the run-time class; ``self._hvdx_base`` is the user's class
    (Horovod's optimizer surface: :class:`~hvdx.torch.compressing_optimizer.
    CompressingOptimizer`)."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step,
                 sum_op, comm):
        self._hvdx_base.__init__(self, params)
        entries = self._hvdx_init_surface(named_parameters, backward_passes_per_step)
        self._hvdx_entries: List[Tuple[str, torch.Tensor]] = entries
        self._hvdx_compression = compression
        self._hvdx_sync = UserCompressionSynchronizer(
            [n for n, _ in entries], compression.compressor, comm, sum_op=sum_op)

    hvdx_strategy = property(lambda self: self._hvdx_compression,
                             doc="The :class:`~hvdx.compression_registry.UserCompression` "
                                 "spec this optimizer runs (read-only).")
    hvdx_stats = property(lambda self: self._hvdx_sync.stats,
                          doc="Bytes this rank's exchanges sent and received "
                              "(``total_sent``, ``total_received``, ``steps``).")

    def synchronize(self):
        """Replace every ``p.grad`` by the compressed average (steps 1 to 3)."""
        grads, sparse = [], []
        for position, (_, p) in enumerate(self._hvdx_entries):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            g = p.grad
            if g.is_sparse:
                sparse.append(position)
                g = g.to_dense()
            grads.append(g)
        arrays = [g.detach().to("cpu", torch.float64 if g.dtype == torch.float64
                                else torch.float32).numpy() for g in grads]
        results = self._hvdx_sync.synchronize(arrays)
        with torch.no_grad():
            for position, (_, p) in enumerate(self._hvdx_entries):
                g = grads[position]
                if results is None:
                    out = torch.full_like(g, float("nan"))
                else:
                    out = torch.from_numpy(results[position]).to(g.device, g.dtype)
                if position in sparse:
                    p.grad = out.to_sparse()
                else:
                    p.grad.copy_(out)
        self._hvdx_synchronized = True

    def state_dict(self):
        state = self._hvdx_base.state_dict(self)
        mine = self._hvdx_sync.state_dict()
        mine["residuals"] = {n: torch.from_numpy(r) for n, r in mine["residuals"].items()}
        state[STATE_KEY] = mine
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        mine = state_dict.pop(STATE_KEY, None)
        if mine is not None:
            mine = dict(mine)
            mine["residuals"] = {n: _to_numpy(r) for n, r in mine["residuals"].items()}
            # A refused checkpoint changes nothing, the wrapped optimizer's state included.
            probe = UserCompressionSynchronizer(self._hvdx_sync.names,
                                                self._hvdx_sync.compressor,
                                                self._hvdx_sync.comm)
            probe.load_state_dict(mine)
        self._hvdx_base.load_state_dict(self, state_dict)
        if mine is not None:
            self._hvdx_sync.load_state_dict(mine)

    def _hvdx_joined_round(self):
        """One step of the other ranks, taken by this rank after ``hvd.join()``
        (:mod:`hvdx.torch.join`): ``True`` once every rank has joined, else ``False``;
        its gradients, residuals and parameters are left alone."""
        return self._hvdx_sync.joined_step()

    def _hvdx_broadcast_shared(self, root_rank):
        """Give every rank ``root_rank``'s step counter (the compressor's seeds may
        depend on it); each rank keeps its own residuals (rank 0 says once that the
        root's are not copied, where it holds any). Collective."""
        mine = (self._hvdx_sync.step,
                _hvd.rank() == root_rank and bool(self._hvdx_sync.residuals))
        step, own_state = _hvd.broadcast_object(mine, root_rank,
                                                name="hvdx.user_compression.step")
        self._hvdx_sync.step = int(step)
        if own_state:
            say_once_per_job(
                "broadcast_optimizer_state: each rank keeps its own compression "
                f"residuals; rank {root_rank}'s are not copied, so a rank that loaded none "
                "starts them from zero")


def _to_numpy(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu").numpy().copy()
    return np.asarray(t).copy()


def adapter(optimizer, spec: UserCompression, setup, args):
    """A registered compressor's adapter in :mod:`hvdx.torch.registry` (the catalogue
    names it for every registered compressor): hvdx's optimizer with error feedback, or
    Horovod's on a rank outside ``process_set``."""
    from hvdx.torch.registry import outside_the_set

    if args.comm is None:
        return outside_the_set(optimizer, args)
    return make_user_compression_optimizer(
        optimizer, args.named_parameters, spec, args.backward_passes_per_step,
        args.op, args.gradient_predivide_factor, args.comm)
