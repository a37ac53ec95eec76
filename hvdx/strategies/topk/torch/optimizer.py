"""The PyTorch optimizer for bidirectional TopK with error feedback.

Zou, De Sterck & Liu, "Downlink Compression Improves TopK Sparsification", arXiv
2209.15203. The math (selection, residuals, aggregation, downlink) is
:mod:`hvdx.strategies.topk.core_bidirectional`; the pair collectives are :mod:`hvdx.mpi.sparse`.
The step itself (NaN/Inf agreement, dense/compressed split, fused exchange, residuals,
counters) is :class:`hvdx.strategies.topk.mpi_sync.TopKSynchronizer`, shared with the TensorFlow
adapter; this module only moves tensors between torch and numpy and runs Horovod's
allreduce for the tensors left dense.

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
4. the others, all together: flatten each to float32 numpy on CPU and run
   :func:`~hvdx.strategies.topk.core_bidirectional.uplink` with its worker residual (selection stays
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
    - ``selection="global"``: one ``k`` over all compressed tensors (see
      :mod:`hvdx.strategies.topk.mpi_sync`).
    - ``autotune_steps``: once the run chose dense, every allreduce starts from a hook
      while the backward pass runs, as in Horovod's own optimizer (same counting of
      ``backward_passes_per_step``), and those steps skip the NaN/Inf agreement (no
      residual is at stake; Horovod has none).
    - ``momentum_correction=True`` (Deep Gradient Compression, Lin et al., arXiv
      1712.01887; the wrapped optimizer must be ``torch.optim.SGD`` without Nesterov or
      dampening): hvdx takes the momentum ``m`` and weight decay ``wd`` of each
      parameter group over. Before step 2, ``g <- g + wd p``; a compressed tensor's
      gradient becomes its local velocity ``v <- m v + g``, which steps 2 to 5 compress;
      after the exchange, ``v`` is zeroed where this rank sent it (factor masking;
      ``momentum_masking=False`` keeps it). A
      dense tensor is averaged first and then gets ``v <- m v + avg`` (SGD's own
      momentum). The wrapped step then runs with momentum and weight decay 0. So tensors
      left dense train exactly as SGD with momentum under Horovod; at ``ratio=1`` a
      compressed tensor sends its whole velocity, which masking then clears: plain SGD on
      the average (without masking: SGD with momentum on the average).
"""

from __future__ import annotations

import weakref
from typing import Dict, List, Optional, Tuple

import numpy as np
import horovod.torch as _hvd
import torch

from hvdx.strategies.topk.mpi_sync import TopKStats, TopKSynchronizer
from hvdx.strategies.topk.presets import momentum_correction_refusal
from hvdx.strategies.topk.spec import TopKCompression
from hvdx.torch.compressing_optimizer import CompressingOptimizer
from hvdx.torch.finite import first_nonfinite
from hvdx.torch.optimizer_state import say_once_per_job
from hvdx.torch.wrapping import subclass_of

__all__ = ["STATE_KEY", "TopKStats", "adapter", "make_topk_optimizer"]

#: The key of hvdx's state in :meth:`state_dict`.
STATE_KEY = "hvdx_topk"

#: Horovod's warning for ``step()`` after ``synchronize()`` outside
#: ``skip_synchronize()``, word for word.
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


class _TopKOptimizer(CompressingOptimizer):
    """Methods copied into the run-time class; ``self._hvdx_base`` is the user's class
    (Horovod's optimizer surface: :class:`~hvdx.torch.compressing_optimizer.
    CompressingOptimizer`)."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step,
                 op, gradient_predivide_factor, sparse_as_dense, process_set, comm):
        self._hvdx_base.__init__(self, params)
        entries = self._hvdx_init_surface(named_parameters, backward_passes_per_step)
        self._hvdx_entries: List[Tuple[str, torch.Tensor]] = entries
        self._hvdx_sync = TopKSynchronizer([n for n, _ in entries], compression, comm,
                                           sum_op=op == _hvd.Sum)
        self._hvdx_op = op
        self._hvdx_predivide = gradient_predivide_factor
        self._hvdx_sparse_as_dense = sparse_as_dense
        self._hvdx_process_set = process_set
        self._hvdx_velocity: Dict[str, torch.Tensor] = {}
        #: Momentum correction: ``(names, buffer)``, the velocities of the compressed
        #: tensors as views of one flat buffer in their fixed order, which the exchange
        #: then reads as one array (no copy into ``p.grad``, no concatenation).
        self._hvdx_flat_velocity: Optional[Tuple[Tuple[str, ...], torch.Tensor]] = None
        if compression.momentum_correction:
            _check_momentum_correction(self)
        #: Once autotune chose dense: the allreduces the backward pass started
        #: (``{position: (handle, was_sparse)}``), the passes each gradient still awaits,
        #: and the hooks that start them.
        self._hvdx_handles: Dict[int, Tuple] = {}
        self._hvdx_delay: Dict[int, int] = {}
        self._hvdx_hooks = None

    # The synchronizer's objects under the names this optimizer always had.
    hvdx_stats = property(lambda self: self._hvdx_sync.stats,
                          doc=":class:`~hvdx.strategies.topk.mpi_sync.TopKStats` (bytes per step).")
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

    def _hvdx_passes_changed(self, passes):
        self._hvdx_delay = dict.fromkeys(self._hvdx_delay, passes)

    def _hvdx_local_step(self, closure=None):
        """The wrapped optimizer's own step on ``p.grad``, with no communication (with
        momentum correction, without its momentum and weight decay)."""
        if not self._hvdx_sync.compression.momentum_correction:
            return self._hvdx_base.step(self, closure)
        # The velocity (and weight decay) went into p.grad already: step without them.
        saved = [(group["momentum"], group["weight_decay"]) for group in self.param_groups]
        try:
            for group in self.param_groups:
                group["momentum"], group["weight_decay"] = 0.0, 0.0
            return self._hvdx_base.step(self, closure)
        finally:
            for group, (momentum, decay) in zip(self.param_groups, saved):
                group["momentum"], group["weight_decay"] = momentum, decay

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
            topk["velocity"] = {n: v.detach().clone() for n, v in self._hvdx_velocity.items()}
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
        self._hvdx_handles.clear()
        self._hvdx_delay = dict.fromkeys(self._hvdx_delay, self.backward_passes_per_step)
        if topk is not None:
            self._hvdx_sync.load_state_dict(topk)
            if self._hvdx_sync.overlaps_dense():
                self._hvdx_register_hooks()
            params = dict(self._hvdx_entries)
            self._hvdx_velocity = {
                n: v.detach().to(params[n].device, params[n].dtype).clone()
                for n, v in topk.get("velocity", {}).items() if n in params}

    def _hvdx_joined_round(self):
        """One step of the other ranks, taken by this rank after ``hvd.join()``
        (:meth:`~hvdx.strategies.topk.mpi_sync.TopKSynchronizer.joined_step`): ``True`` once every
        rank has joined, ``False`` after a step of the others, ``None`` when hvdx runs no
        collective of its own (autotune chose dense: Horovod's join answers everything).
        Gradients, velocities and parameters are left alone."""
        sync = self._hvdx_sync
        if sync.overlaps_dense():
            return None
        return sync.joined_step([p.numel() for _, p in self._hvdx_entries],
                                agree_first=sync.compression.momentum_correction)

    def _hvdx_broadcast_shared(self, root_rank):
        """Give every rank ``root_rank``'s share of hvdx's state that the ranks must hold
        alike; collective.

        1. the synchronizer's (:meth:`~hvdx.strategies.topk.mpi_sync.TopKSynchronizer.
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
            dense = self._hvdx_dense_names()
            velocity = {n: v.detach().cpu() for n, v in self._hvdx_velocity.items()
                        if n in dense}
            velocity = _hvd.broadcast_object(velocity, root_rank,
                                             name="hvdx.topk.dense_velocity")
            params = dict(self._hvdx_entries)
            for name in dense:
                if name in velocity:
                    self._hvdx_velocity[name] = velocity[name].to(
                        params[name].device, params[name].dtype).clone()
                else:
                    self._hvdx_velocity.pop(name, None)
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

    def _hvdx_dense_names(self):
        """The names of the tensors the next step leaves dense (sparse gradients
        aside, which keep no velocity)."""
        dense, _ = self._hvdx_sync.split([p.numel() for _, p in self._hvdx_entries])
        return {self._hvdx_entries[position][0] for position in dense}

    # --- internals ------------------------------------------------------------------

    def _hvdx_register_hooks(self):
        """Once autotune chose dense: start each gradient's allreduce as soon as the
        backward pass has accumulated it, as Horovod's own optimizer does, so that
        communication overlaps the rest of the backward pass.

        The hooks hold the optimizer weakly: an optimizer dropped by the user stops
        reacting to the parameters' gradients.
        """
        if self._hvdx_hooks is not None:
            return
        this = weakref.ref(self)

        def make_hook(position):
            def hook(_):
                optimizer = this()
                if optimizer is not None:
                    optimizer._hvdx_gradient_ready(position)
            return hook

        self._hvdx_delay = {position: self.backward_passes_per_step
                            for position in range(len(self._hvdx_entries))}
        self._hvdx_hooks = [p.register_post_accumulate_grad_hook(make_hook(position))
                            for position, (_, p) in enumerate(self._hvdx_entries)]

    def _hvdx_gradient_ready(self, position):
        """A backward pass accumulated ``position``'s gradient: after the
        ``backward_passes_per_step``-th, start its allreduce (Horovod's hook)."""
        if not self._hvdx_sync.overlaps_dense():
            return
        if position in self._hvdx_handles or self._hvdx_delay[position] <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before "
                "call to step(). Increase backward_passes_per_step to accumulate gradients "
                "locally.")
        self._hvdx_delay[position] -= 1
        name, p = self._hvdx_entries[position]
        if self._hvdx_delay[position] == 0 and not p.grad.is_sparse:
            self._hvdx_handles[position] = self._hvdx_dense_async(name, p)

    def _hvdx_synchronize_dense(self):
        """A step after autotune chose dense: Horovod's average of every gradient.

        1. start the allreduces the backward pass did not (a gradient set by hand, a
           sparse one, a parameter without gradient: zeros, as Horovod sends);
        2. wait for all of them, in the fixed order;
        3. with ``momentum_correction``: weight decay on the average (the parameters are
           the same on every rank, so this is the average of the decayed gradients), then
           SGD's momentum, as for any tensor left dense.
        No NaN/Inf agreement: no residual is at stake, and Horovod has none.
        """
        entries = self._hvdx_entries
        for position, (name, p) in enumerate(entries):
            if position not in self._hvdx_handles:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self._hvdx_handles[position] = self._hvdx_dense_async(name, p)
        for position in sorted(self._hvdx_handles):
            self._hvdx_dense_wait(position, self._hvdx_handles[position])
        self._hvdx_handles.clear()
        self._hvdx_delay = dict.fromkeys(self._hvdx_delay, self.backward_passes_per_step)
        grads = [p.grad for _, p in entries]
        self._hvdx_sync.dense_step([g.numel() for g in grads],
                                   [g.element_size() for g in grads])
        if self._hvdx_sync.compression.momentum_correction:
            self._hvdx_weight_decay()
            self._hvdx_after_exchange([])

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

    def _hvdx_group_of(self):
        """``{id(parameter): its param_group}``."""
        return {id(p): group for group in self.param_groups for p in group["params"]}

    def _hvdx_local_momentum(self, grads):
        """Momentum correction, before the exchange: weight decay into every gradient,
        then each compressed tensor's local velocity ``v <- m v + g``, which the exchange
        compresses instead of the gradient (``p.grad`` receives the update after it)."""
        entries, groups = self._hvdx_entries, self._hvdx_group_of()
        _, compressed = self._hvdx_sync.split(
            [g.numel() for g in grads], [i for i, g in enumerate(grads) if g.is_sparse])
        self._hvdx_weight_decay()
        fresh = self._hvdx_flatten_velocity(compressed)
        with torch.no_grad():
            for position in compressed:
                name, p = entries[position]
                v = self._hvdx_velocity.get(name)
                if v is None:
                    self._hvdx_velocity[name] = p.grad.detach().clone()
                elif name in fresh:
                    v.copy_(p.grad)
                else:  # v <- m v + g in one pass over v
                    torch.add(p.grad, v, alpha=groups[id(p)]["momentum"], out=v)
        return compressed

    def _hvdx_flatten_velocity(self, compressed):
        """Keep the velocities of the ``compressed`` positions as consecutive views of one
        flat buffer (when they share a dtype and a device); return the names whose
        velocity starts this step (zero in the buffer, not yet set).

        The buffer is rebuilt, keeping every velocity's values, when the compressed set
        changed or a velocity was replaced (a loaded checkpoint)."""
        entries, velocity = self._hvdx_entries, self._hvdx_velocity
        names = tuple(entries[p][0] for p in compressed)
        layout = self._hvdx_flat_velocity
        if layout is not None and layout[0] == names and all(
                n in velocity and velocity[n]._base is layout[1] for n in names):
            return ()
        self._hvdx_flat_velocity = None
        params = [entries[p][1] for p in compressed]
        if not params or len({(p.dtype, p.grad.device) for p in params}) != 1:
            return ()
        buffer = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype,
                             device=params[0].grad.device)
        fresh, start = set(), 0
        with torch.no_grad():
            for name, p in zip(names, params):
                view = buffer[start:start + p.numel()].view(p.shape)
                start += p.numel()
                old = velocity.get(name)
                if old is None:
                    fresh.add(name)
                else:
                    view.copy_(old)
                velocity[name] = view
        self._hvdx_flat_velocity = (names, buffer)
        return fresh

    def _hvdx_after_exchange(self, compressed):
        """Momentum correction, after the exchange: factor masking for the compressed
        tensors, SGD's momentum on the average for the dense ones."""
        entries, groups = self._hvdx_entries, self._hvdx_group_of()
        sent = self._hvdx_sync.last_sent if self._hvdx_sync.compression.momentum_masking \
            else {}
        done = set(compressed)
        with torch.no_grad():
            for position in compressed:
                name, p = entries[position]
                indices = sent.get(position)
                if indices is not None and len(indices):
                    self._hvdx_velocity[name].view(-1)[
                        torch.from_numpy(np.asarray(indices, np.int64)).to(p.device)] = 0
            for position, (name, p) in enumerate(entries):
                if position in done or p.grad.is_sparse:
                    continue
                momentum = groups[id(p)]["momentum"]
                v = self._hvdx_velocity.get(name)
                v = p.grad.detach().clone() if v is None else v.mul_(momentum).add_(p.grad)
                self._hvdx_velocity[name] = v
                p.grad.copy_(v)

    def _hvdx_weight_decay(self):
        """Momentum correction: ``g <- g + wd p`` for every dense ``p.grad``, with its
        group's ``wd`` (the wrapped SGD then steps without weight decay)."""
        groups = self._hvdx_group_of()
        with torch.no_grad():
            for _, p in self._hvdx_entries:
                decay = groups[id(p)]["weight_decay"]
                if decay and not p.grad.is_sparse:
                    p.grad.add_(p.detach(), alpha=decay)

    def _hvdx_dense_wait(self, position, started):
        """Wait for ``started = (handle, was_sparse)`` of :meth:`_hvdx_dense_async`;
        a gradient that was sparse becomes sparse again."""
        handle, was_sparse = started
        out = _hvd.synchronize(handle)
        if was_sparse:
            self._hvdx_entries[position][1].grad = out.to_sparse()

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
        return handle, was_sparse


def _check_momentum_correction(optimizer) -> None:
    """``momentum_correction`` takes SGD's momentum over: SGD without Nesterov or
    dampening only (anything else would be applied twice or differently). The same test
    decides whether a preset keeps it (:func:`hvdx.strategies.topk.presets.for_optimizer`)."""
    refusal = momentum_correction_refusal(optimizer._hvdx_base.__name__,
                                          optimizer.param_groups)
    if refusal is not None:
        raise ValueError(refusal)


def _numpy(t: torch.Tensor) -> np.ndarray:
    """``t`` flat as float32 numpy on the CPU: a view when it already is CPU float32."""
    return t.detach().reshape(-1).to("cpu", torch.float32).numpy()


def _to_numpy(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu").numpy().copy()
    return np.asarray(t).copy()


def adapter(optimizer, strategy: TopKCompression, plan, args):
    """TopK's adapter in :mod:`hvdx.torch.registry` (the catalogue names it): hvdx's
    TopK optimizer, or Horovod's on a rank outside ``process_set``."""
    from hvdx.torch.registry import outside_the_set

    if args.comm is None:
        return outside_the_set(optimizer, args)
    return make_topk_optimizer(
        optimizer, args.named_parameters, strategy, args.backward_passes_per_step,
        args.op, args.gradient_predivide_factor, args.sparse_as_dense, args.process_set,
        args.comm)
