"""The PyTorch optimizer for bidirectional TopK with error feedback.

Zou, De Sterck & Liu, "Downlink Compression Improves TopK Sparsification", arXiv
2209.15203. The step itself (NaN/Inf agreement, dense/compressed split, fused exchange,
residuals, counters) is GRACE's driver,
:class:`hvdx.strategies.topk.mpi_driver.TopKSynchronizer`, shared with the TensorFlow
adapter; this module moves tensors between torch and numpy, with two parts of its own:
Horovod's allreduce of the tensors left dense
(:mod:`hvdx.strategies.topk.torch.dense_allreduce`) and DGC's momentum correction
(:mod:`hvdx.strategies.topk.torch.momentum_correction`).

One :meth:`step` (``synchronize`` then the wrapped optimizer's ``step``):

1. take every parameter's gradient in the optimizer's ``param_groups`` order (the order
   the fingerprint checked, the same on every rank); a missing gradient is zeros, as in
   Horovod, because another rank may have one;
2. check all gradients for NaN/Inf and combine the result across ranks with one tiny
   allgather. If any rank has one, every rank skips the rest of the step alike: every
   ``p.grad`` becomes NaN and no residual, velocity (``momentum_correction``), step
   counter or byte counter changes. Horovod's allreduce would carry the inf/NaN into
   every rank's average, and ``torch.amp.GradScaler`` counts on that to skip
   ``step`` and lower its scale on every rank together (the AMP recipe: ``synchronize``,
   then ``scaler.step`` inside ``skip_synchronize``); the residuals must not take in a
   bad gradient, which error feedback would resend forever;
3. tensors with fewer than ``min_size`` entries, sparse gradients, and every tensor
   during ``warmup_steps``: Horovod's allreduce (op, ``gradient_predivide_factor``);
   with ``small_tensors="in_topk_step"`` the small ones of a compressed step are averaged
   by the synchronizer instead (one MPI allreduce), so that Horovod carries nothing then;
4. the others, all together: flatten each to float32 numpy on CPU, compensate it with
   its worker residual and select its top ``k`` (selection stays layer-wise: each
   tensor keeps its own ``k``), then exchange the pairs of all tensors at
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
    - ``selection="global"``: one ``k`` over all compressed tensors (see
      :mod:`hvdx.strategies.topk.core_concatenation`).
    - ``autotune_steps``: once the run chose dense, every allreduce starts from a hook
      while the backward pass runs, as in Horovod's own optimizer (same counting of
      ``backward_passes_per_step``), and those steps skip the NaN/Inf agreement (no
      residual is at stake; Horovod has none).
    - ``momentum_correction=True`` (Deep Gradient Compression, Lin et al., arXiv
      1712.01887; ``torch.optim.SGD`` without Nesterov or dampening): after step 2 a
      compressed tensor's gradient becomes its local velocity, which steps 3 to 5
      compress; the wrapped step then runs without momentum and weight decay
      (:mod:`hvdx.strategies.topk.torch.momentum_correction`).
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np
import horovod.torch as _hvd
import torch

from hvdx.strategies.topk.core_counters import TopKStats
from hvdx.strategies.topk.mpi_driver import TopKSynchronizer
from hvdx.strategies.topk.spec import TopKCompression
from hvdx.strategies.topk.torch.dense_allreduce import DenseAllreduce
from hvdx.strategies.topk.torch.momentum_correction import MomentumCorrection
from hvdx.torch.compressing_optimizer import CompressingOptimizer
from hvdx.torch.finite import first_nonfinite
from hvdx.torch.optimizer_state import say_once_per_job
from hvdx.torch.wrapping import subclass_of

__all__ = ["STATE_KEY", "TopKStats", "adapter", "make_topk_optimizer"]

#: The key of hvdx's state in :meth:`state_dict`.
STATE_KEY = "hvdx_topk"


def make_topk_optimizer(optimizer, named_parameters, compression: TopKCompression,
                        backward_passes_per_step, op, gradient_predivide_factor,
                        sparse_as_dense, process_set, comm):
    """An instance of a class made at run time from ``optimizer``'s class.

    ``isinstance(result, type(optimizer))`` holds. The base class is captured in the new
    class (``_hvdx_base``), never found through ``super(self.__class__, self)``, so
    subclassing the result does not recurse. The arguments passed the spec's job checks
    (:meth:`TopKCompression.prepare`) at the entry point.
    """
    cls = subclass_of(optimizer, _TopKOptimizer)
    return cls(optimizer.param_groups, named_parameters, compression,
               backward_passes_per_step, op, gradient_predivide_factor, sparse_as_dense,
               process_set, comm)


class _TopKOptimizer(MomentumCorrection, DenseAllreduce, CompressingOptimizer):
    """Methods copied into the run-time class; ``self._hvdx_base`` is the user's class
    (Horovod's optimizer surface: :class:`~hvdx.torch.compressing_optimizer.
    CompressingOptimizer`, whose ``_hvdx_local_step`` and ``_hvdx_passes_changed`` the
    two parts before it override: DGC's momentum correction,
    :class:`~hvdx.strategies.topk.torch.momentum_correction.MomentumCorrection`, and
    Horovod's allreduce, :class:`~hvdx.strategies.topk.torch.dense_allreduce.
    DenseAllreduce`)."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step,
                 op, gradient_predivide_factor, sparse_as_dense, process_set, comm):
        self._hvdx_base.__init__(self, params)
        entries = self._hvdx_init_surface(named_parameters, backward_passes_per_step)
        self._hvdx_entries: List[Tuple[str, torch.Tensor]] = entries
        self._hvdx_sync = TopKSynchronizer([n for n, _ in entries], compression, comm,
                                           sum_op=op == _hvd.Sum)
        self._hvdx_sparse_as_dense = sparse_as_dense
        self._hvdx_init_dense(op, gradient_predivide_factor, process_set)
        self._hvdx_init_momentum(compression)

    # The synchronizer's objects under the names this optimizer always had.
    hvdx_stats = property(lambda self: self._hvdx_sync.stats,
                          doc=":class:`~hvdx.strategies.topk.core_counters.TopKStats` "
                              "(bytes per step).")
    hvdx_strategy = property(lambda self: self._hvdx_sync.compression,
                             doc="The :class:`~hvdx.strategies.topk.spec.TopKCompression` spec "
                                 "this optimizer runs (read-only).")
    hvdx_mode = property(lambda self: self._hvdx_sync.mode,
                         doc="``\"gathered\"`` or ``\"sharded\"``: the exchange this "
                             "optimizer runs, ``mode=\"auto\"`` resolved for its ranks "
                             "(read-only).")
    _hvdx_worker = property(lambda self: self._hvdx_sync.worker)
    _hvdx_server = property(lambda self: self._hvdx_sync.server)
    _hvdx_comm = property(lambda self: self._hvdx_sync.comm,
                          lambda self, comm: setattr(self._hvdx_sync, "comm", comm))

    # --- the public surface of Horovod's optimizer -----------------------------------

    def synchronize(self):
        """Replace every ``p.grad`` by the TopK-compressed average (steps 1 to 5).

        Once autotune chose dense, by Horovod's average, whose allreduces the backward
        pass has started (:meth:`_hvdx_synchronize_dense`).
        """
        if self._hvdx_sync.overlaps_dense():
            self._hvdx_synchronize_dense()
            self._hvdx_synchronized = True
            return
        grads = []
        for name, p in self._hvdx_entries:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        entries = self._hvdx_entries
        pending = []
        correction = self._hvdx_sync.compression.momentum_correction
        first_bad = first_nonfinite(grads)
        compressed = ()
        if correction:
            # The velocity is state like the residuals: agree on NaN/Inf before a bad
            # gradient enters it (a NaN in the velocity would never leave it).
            if not self._hvdx_sync.check_finite(first_bad):
                self._hvdx_skip_nonfinite()
                return
            first_bad = None
            compressed = self._hvdx_local_momentum(grads)
        velocities = set(compressed)

        def start_dense(positions):
            pending.extend((position, self._hvdx_dense_async(*entries[position]))
                           for position in positions)
            return wait_dense

        def wait_dense():
            # Called by the synchronizer once the sparse exchange is done, so that the
            # two overlap, and timed by it during autotune steps.
            for position, started in pending:
                self._hvdx_dense_wait(position, started)
            pending.clear()

        def flat(position):
            name, p = entries[position]
            # With momentum correction the velocity is what this step compresses (an
            # autotune step's dry run, whose tensors stay dense, reads the gradient).
            return _numpy(self._hvdx_velocity[name] if position in velocities else p.grad)

        def joined(positions):
            # The buffer holds this step's compressed velocities, in their order.
            layout = self._hvdx_flat_velocity
            if layout is None or list(positions) != list(compressed):
                return None
            return _numpy(layout[1])

        given = {}

        def out(position):
            # The update straight into p.grad's memory where it is CPU float32 (zeroed,
            # then the selected entries set), instead of a dense temporary copied in.
            g = entries[position][1].grad
            if g.device.type == "cpu" and g.dtype == torch.float32 and g.is_contiguous():
                given[position] = g.detach().view(-1).numpy()
                return given[position]
            return None

        updates = self._hvdx_sync.synchronize(
            [g.numel() for g in grads], flat, start_dense, first_bad,
            force_dense=[i for i, g in enumerate(grads) if g.is_sparse],
            itemsizes=[g.element_size() for g in grads], joined=joined, out=out)
        if updates is None:  # a gradient was not finite on some rank: the step is skipped
            self._hvdx_skip_nonfinite()
            return
        for position, u in updates.items():
            if u is given.get(position):
                continue
            p = entries[position][1]
            with torch.no_grad():
                p.grad.copy_(torch.from_numpy(u).view(p.grad.shape))
        if correction:
            self._hvdx_after_exchange(compressed)
        self._hvdx_synchronized = True
        if self._hvdx_sync.overlaps_dense():  # decided in this step: overlap from the next
            self._hvdx_register_hooks()

    # --- state ----------------------------------------------------------------------

    def state_dict(self):
        state = self._hvdx_base.state_dict(self)
        topk = self._hvdx_sync.state_dict()
        for side in ("worker", "server"):
            topk[side] = {n: torch.from_numpy(e) for n, e in topk[side].items()}
        if self._hvdx_velocity:
            topk["velocity"] = self._hvdx_velocity_state()
        state[STATE_KEY] = topk
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        topk = state_dict.pop(STATE_KEY, None)
        if topk is not None:
            topk = dict(topk)
            for side in ("worker", "server"):
                topk[side] = {n: _to_numpy(t) for n, t in topk[side].items()}
            # A refused checkpoint changes nothing, the wrapped optimizer's state included.
            self._hvdx_sync.check_state_dict(topk)
        self._hvdx_base.load_state_dict(self, state_dict)
        self._hvdx_forget_started()
        if topk is not None:
            self._hvdx_sync.load_state_dict(topk)
            if self._hvdx_sync.overlaps_dense():
                self._hvdx_register_hooks()
            self._hvdx_load_velocity(topk.get("velocity", {}))

    def _hvdx_joined_round(self):
        """One step of the other ranks, taken by this rank after ``hvd.join()``
        (:meth:`~hvdx.strategies.topk.mpi_driver.TopKSynchronizer.joined_step`): ``True``
        once every rank has joined, ``False`` after a step of the others, ``None`` when
        hvdx runs no collective of its own (autotune chose dense: Horovod's join answers
        everything). Gradients, velocities and parameters are left alone."""
        sync = self._hvdx_sync
        if sync.overlaps_dense():
            return None
        return sync.joined_step([p.numel() for _, p in self._hvdx_entries],
                                agree_first=sync.compression.momentum_correction)

    def _hvdx_broadcast_shared(self, root_rank):
        """Give every rank ``root_rank``'s share of hvdx's state that the ranks must hold
        alike; collective.

        1. the synchronizer's (:meth:`~hvdx.strategies.topk.mpi_driver.TopKSynchronizer.
           shared_state`: the step, autotune's choice, a ``gathered`` server's residuals);
        2. with ``momentum_correction``, the velocity of every tensor the next step
           leaves dense (below ``min_size``, during warm-up or autotune, or once
           autotune chose dense): SGD's momentum of the *average*, the same on every
           rank by design, so a rank that kept its own would apply another update
           from then on.

        Each rank keeps its worker residuals and the velocities of the compressed
        tensors: they are its own by design (what it has not sent yet). Rank 0 says
        once that they are not copied, where the root holds any.
        """
        sync = self._hvdx_sync
        root = _hvd.rank() == root_rank
        shared = sync.shared_state()
        shared["own_state"] = root and bool(sync.worker.state_dict() or set(
            self._hvdx_velocity) - self._hvdx_dense_names())
        shared = _hvd.broadcast_object(shared, root_rank, name="hvdx.topk.shared_state")
        own_state = shared.pop("own_state")
        sync.load_shared_state(shared)
        if sync.compression.momentum_correction:
            self._hvdx_broadcast_dense_velocity(root_rank)
        if own_state:
            say_once_per_job(
                "broadcast_optimizer_state: each rank keeps its own TopK residuals"
                + (" and compressed tensors' velocities" if sync.compression.
                   momentum_correction else "")
                + f"; rank {root_rank}'s are not copied, so a rank that loaded none "
                "starts them from zero (its updates are unchanged: every rank applies "
                "the same average)")
        if sync.overlaps_dense():
            self._hvdx_register_hooks()

    # --- internals ------------------------------------------------------------------

    def _hvdx_skip_nonfinite(self):
        """A step whose gradients are not finite on some rank (step 2): every ``p.grad``
        becomes NaN, on its own device and in its own dtype, and nothing else changes.

        Horovod's allreduce would carry the inf/NaN into every rank's average, and a
        ``GradScaler`` counts on that to skip ``step`` and lower its scale on every rank
        together; a scaler that skipped on one rank only would leave the parameters
        different across ranks. Every entry is NaN, not one entry inf, so that no usual
        transform of the gradient makes it look finite again: clipping by value would
        turn an inf into a finite number, and NaN stays NaN through it, a norm or a
        product.
        """
        with torch.no_grad():
            for _, p in self._hvdx_entries:
                g = p.grad
                if g.is_sparse:  # as the dense path returns it: densified, sparse again
                    p.grad = torch.full(g.shape, float("nan"), dtype=g.dtype,
                                        device=g.device).to_sparse()
                else:
                    g.fill_(float("nan"))
        self._hvdx_synchronized = True


def _numpy(t: torch.Tensor) -> np.ndarray:
    """``t`` flat as float32 numpy on the CPU: a view when it already is CPU float32."""
    return t.detach().reshape(-1).to("cpu", torch.float32).numpy()


def _to_numpy(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu").numpy().copy()
    return np.asarray(t).copy()


def adapter(optimizer, strategy: TopKCompression, setup, args):
    """TopK's adapter in :mod:`hvdx.torch.registry` (the catalogue names it): hvdx's
    TopK optimizer, or Horovod's on a rank outside ``process_set``."""
    from hvdx.torch.registry import outside_the_set

    if args.comm is None:
        return outside_the_set(optimizer, args)
    return make_topk_optimizer(
        optimizer, args.named_parameters, strategy, args.backward_passes_per_step,
        args.op, args.gradient_predivide_factor, args.sparse_as_dense, args.process_set,
        args.comm)
