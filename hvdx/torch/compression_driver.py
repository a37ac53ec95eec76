"""The PyTorch compression driver: one optimizer class runs every compression strategy,
built-in TopK and a registered compressor alike.

A compression strategy's spec names its synchronizer (its catalogue entry's
``synchronizer``): the framework-neutral step of its compressor, memory and
communicator over mpi4py (:data:`hvdx.core.compression_protocol.SYNCHRONIZER_METHODS`):
:class:`~hvdx.strategies.topk.mpi_driver.TopKSynchronizer` for TopK (Zou, De Sterck &
Liu, arXiv 2209.15203), :class:`~hvdx.mpi.user_compression_exchange.
UserCompressionSynchronizer` for a registered compressor. This module only moves
tensors between torch and numpy around it, with the two capabilities the protocol
names and TopK uses: Horovod's allreduce of the tensors a step leaves dense
(:mod:`hvdx.torch.dense_allreduce`) and DGC's momentum correction
(:mod:`hvdx.torch.momentum_correction`).

One :meth:`step` (``synchronize`` then the wrapped optimizer's ``step``):

1. take every parameter's gradient in the optimizer's ``param_groups`` order (the order
   the fingerprint checked, the same on every rank); a missing gradient is zeros, as in
   Horovod, because another rank may have one;
2. name this rank's first gradient with NaN or Inf, which the synchronizer agrees on
   across ranks. If any rank has one, every rank skips the rest of the step alike:
   every ``p.grad`` becomes NaN and no residual, velocity, step counter or byte counter
   changes. Horovod's allreduce would carry the inf/NaN into every rank's average, and
   ``torch.amp.GradScaler`` counts on that to skip ``step`` and lower its scale on
   every rank together (the AMP recipe: ``synchronize``, then ``scaler.step`` inside
   ``skip_synchronize``); the residuals must not take in a bad gradient, which error
   feedback would resend forever;
3. the synchronizer's step on flat CPU numpy views of the gradients (float32; float64
   stays float64 where the synchronizer keeps it): the tensors it leaves dense (TopK:
   below ``min_size``, sparse gradients, warm-up and autotune steps) go through
   Horovod's allreduce (op, ``gradient_predivide_factor``), started before its own
   exchange so that the two overlap; the others are compressed with error feedback and
   exchanged (TopK: its ``gathered`` or ``sharded`` communicator, fused over all
   tensors; a registered compressor: ``allgather`` or ``allreduce``);
4. write each result into ``p.grad`` (its device and dtype; sparse again where it was);
5. the wrapped optimizer's ``step``.

Notes:
    - Residuals hold gradients, not ``lr * g``.
    - ``backward_passes_per_step``: gradients accumulate in ``p.grad`` between steps
      (call ``step`` once per N passes); the sum is what is compressed, as Horovod
      allreduces the sum.
    - TopK's ``autotune_steps``: once the run chose dense, every allreduce starts from a
      hook while the backward pass runs, as in Horovod's own optimizer, and those steps
      skip the NaN/Inf agreement (no residual is at stake; Horovod has none).
    - TopK's ``momentum_correction=True`` (Deep Gradient Compression, Lin et al., arXiv
      1712.01887; ``torch.optim.SGD`` without Nesterov or dampening): after step 2 a
      compressed tensor's gradient becomes its local velocity, which step 3 compresses;
      the wrapped step then runs without momentum and weight decay.

The state is in ``optimizer.state_dict()`` under the synchronizer's ``STATE_KEY``
(``"hvdx_topk"``, ``"hvdx_user_compression"``); each rank's residuals are its own
(``hvd.save_checkpoint`` keeps every rank's in one file).
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np
import horovod.torch as _hvd
import torch

from hvdx.strategies import catalogue
from hvdx.torch.compressing_optimizer import CompressingOptimizer
from hvdx.torch.dense_allreduce import DenseAllreduce
from hvdx.torch.finite import first_nonfinite
from hvdx.torch.momentum_correction import MomentumCorrection
from hvdx.torch.optimizer_state import say_once_per_job
from hvdx.torch.wrapping import subclass_of

__all__ = ["adapter", "make_compression_optimizer"]


def make_compression_optimizer(optimizer, named_parameters, spec, backward_passes_per_step,
                               op, gradient_predivide_factor, sparse_as_dense,
                               process_set, comm):
    """An instance of a class made at run time from ``optimizer``'s class.

    ``isinstance(result, type(optimizer))`` holds. The base class is captured in the new
    class (``_hvdx_base``), never found through ``super(self.__class__, self)``, so
    subclassing the result does not recurse. The arguments passed the spec's job checks
    (:meth:`hvdx.strategy_contract.CompressionStrategy.prepare`) at the entry point.
    """
    cls = subclass_of(optimizer, _CompressionOptimizer)
    return cls(optimizer.param_groups, named_parameters, spec,
               backward_passes_per_step, op, gradient_predivide_factor, sparse_as_dense,
               process_set, comm)


class _CompressionOptimizer(MomentumCorrection, DenseAllreduce, CompressingOptimizer):
    """Methods copied into the run-time class; ``self._hvdx_base`` is the user's class
    (Horovod's optimizer surface: :class:`~hvdx.torch.compressing_optimizer.
    CompressingOptimizer`, whose ``_hvdx_local_step`` and ``_hvdx_passes_changed`` the
    two capabilities before it override: DGC's momentum correction,
    :class:`~hvdx.torch.momentum_correction.MomentumCorrection`, and Horovod's
    allreduce, :class:`~hvdx.torch.dense_allreduce.DenseAllreduce`)."""

    def __init__(self, params, named_parameters, spec, backward_passes_per_step,
                 op, gradient_predivide_factor, sparse_as_dense, process_set, comm):
        self._hvdx_base.__init__(self, params)
        entries = self._hvdx_init_surface(named_parameters, backward_passes_per_step)
        self._hvdx_entries: List[Tuple[str, torch.Tensor]] = entries
        self._hvdx_spec = spec
        self._hvdx_sync = catalogue.synchronizer_of(spec).for_spec(
            [n for n, _ in entries], spec, comm, sum_op=op == _hvd.Sum,
            shapes=[tuple(p.shape) for _, p in entries])
        self._hvdx_sparse_as_dense = sparse_as_dense
        self._hvdx_init_dense(op, gradient_predivide_factor, process_set)
        self._hvdx_init_momentum(spec)

    # The synchronizer's objects under the names this optimizer always had.
    hvdx_stats = property(lambda self: self._hvdx_sync.stats,
                          doc="The synchronizer's byte counters (TopK's "
                              ":class:`~hvdx.strategies.topk.core_counters.TopKStats`, "
                              "a registered compressor's ``total_sent``, "
                              "``total_received``, ``steps``).")
    hvdx_strategy = property(lambda self: self._hvdx_spec,
                             doc="The compression spec this optimizer runs (read-only).")
    hvdx_mode = property(lambda self: self._hvdx_sync.mode,
                         doc="The communicator this optimizer runs: TopK's "
                             "``\"gathered\"`` or ``\"sharded\"`` (``mode=\"auto\"`` "
                             "resolved for its ranks), a registered compressor's "
                             "``\"allgather\"`` or ``\"allreduce\"`` (read-only).")
    _hvdx_worker = property(lambda self: self._hvdx_sync.worker)
    _hvdx_server = property(lambda self: self._hvdx_sync.server)
    _hvdx_comm = property(lambda self: self._hvdx_sync.comm,
                          lambda self, comm: setattr(self._hvdx_sync, "comm", comm))

    # --- the public surface of Horovod's optimizer -----------------------------------

    def synchronize(self):
        """Replace every ``p.grad`` by the compressed average (steps 1 to 4).

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
        correction = self._hvdx_momentum
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

        keeps_float64 = self._hvdx_sync.KEEPS_FLOAT64

        def flat(position):
            name, p = entries[position]
            # With momentum correction the velocity is what this step compresses (an
            # autotune step's dry run, whose tensors stay dense, reads the gradient).
            t = self._hvdx_velocity[name] if position in velocities else p.grad
            return _numpy(t.to_dense() if t.is_sparse else t, keeps_float64)

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
                update = torch.from_numpy(u).view(p.grad.shape)
                if p.grad.is_sparse:  # a synchronizer that compressed it densified
                    p.grad = update.to(p.grad.device, p.grad.dtype).to_sparse()
                else:
                    p.grad.copy_(update)
        if correction:
            self._hvdx_after_exchange(compressed)
        self._hvdx_synchronized = True
        if self._hvdx_sync.overlaps_dense():  # decided in this step: overlap from the next
            self._hvdx_register_hooks()

    # --- state ----------------------------------------------------------------------

    def state_dict(self):
        state = self._hvdx_base.state_dict(self)
        sync = self._hvdx_sync
        mine = sync.state_dict()
        for entry in sync.ARRAY_ENTRIES:
            mine[entry] = {n: torch.from_numpy(e) for n, e in mine[entry].items()}
        if self._hvdx_velocity:
            mine["velocity"] = self._hvdx_velocity_state()
        state[sync.STATE_KEY] = mine
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        sync = self._hvdx_sync
        mine = state_dict.pop(sync.STATE_KEY, None)
        if mine is not None:
            mine = dict(mine)
            for entry in sync.ARRAY_ENTRIES:
                mine[entry] = {n: _to_numpy(t) for n, t in mine[entry].items()}
            # A refused checkpoint changes nothing, the wrapped optimizer's state included.
            sync.check_state_dict(mine)
        self._hvdx_base.load_state_dict(self, state_dict)
        self._hvdx_forget_started()
        if mine is not None:
            sync.load_state_dict(mine)
            if sync.overlaps_dense():
                self._hvdx_register_hooks()
            self._hvdx_load_velocity(mine.get("velocity", {}))

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
                                agree_first=self._hvdx_momentum)

    def _hvdx_broadcast_shared(self, root_rank):
        """Give every rank ``root_rank``'s share of hvdx's state that the ranks must hold
        alike; collective.

        1. the synchronizer's ``shared_state()`` (the step; TopK's autotune choice and
           a ``gathered`` server's residuals too);
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
        shared["own_state"] = root and bool(sync.holds_own_state() or (
            self._hvdx_momentum and set(self._hvdx_velocity) - self._hvdx_dense_names()))
        shared = _hvd.broadcast_object(shared, root_rank,
                                       name=f"{sync.STATE_KEY}.shared_state")
        own_state = shared.pop("own_state")
        sync.load_shared_state(shared)
        if self._hvdx_momentum:
            self._hvdx_broadcast_dense_velocity(root_rank)
        if own_state:
            say_once_per_job(
                f"broadcast_optimizer_state: each rank keeps its own {sync.RESIDUALS}"
                + (" and compressed tensors' velocities" if self._hvdx_momentum else "")
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


def _numpy(t: torch.Tensor, keeps_float64: bool = False) -> np.ndarray:
    """``t`` flat as float32 numpy on the CPU (float64 stays float64 where the
    synchronizer keeps it): a view when it already is so on the CPU."""
    dtype = torch.float64 if keeps_float64 and t.dtype == torch.float64 else torch.float32
    return t.detach().reshape(-1).to("cpu", dtype).numpy()


def _to_numpy(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu").numpy().copy()
    return np.asarray(t).copy()


def adapter(optimizer, spec, setup, args):
    """Every compression strategy's adapter in :mod:`hvdx.torch.registry` (the
    catalogue's default for the kind ``compression``): hvdx's optimizer, or Horovod's on
    a rank outside ``process_set``."""
    from hvdx.torch.registry import outside_the_set

    if args.comm is None:
        return outside_the_set(optimizer, args)
    return make_compression_optimizer(
        optimizer, args.named_parameters, spec, args.backward_passes_per_step,
        args.op, args.gradient_predivide_factor, args.sparse_as_dense, args.process_set,
        args.comm)
