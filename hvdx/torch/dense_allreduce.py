"""Horovod's allreduce in the PyTorch compression driver (:mod:`hvdx.torch.compression_driver`),
a capability TopK uses: the tensors a step leaves dense, and every tensor once autotune
chose dense.

The tensors TopK leaves dense (fewer than ``min_size`` entries, sparse gradients, the
warm-up and autotune steps) are averaged by Horovod's own allreduce, with the
optimizer's ``op``, ``gradient_predivide_factor`` and process set
(:meth:`DenseAllreduce._hvdx_dense_async`); a sparse gradient is densified for it and
made sparse again after (:meth:`DenseAllreduce._hvdx_dense_wait`).

Once autotune chose dense (:meth:`~hvdx.strategies.topk.mpi_driver.TopKSynchronizer.
overlaps_dense`), every step is Horovod's, as in Horovod's own optimizer:

1. a hook on each parameter starts its allreduce as soon as the backward pass has
   accumulated its gradient for the ``backward_passes_per_step``-th time, so that
   communication overlaps the rest of the backward pass
   (:meth:`DenseAllreduce._hvdx_register_hooks`);
2. ``synchronize`` starts those the backward pass did not, waits for all of them in
   the fixed order, and only counts the step (:meth:`DenseAllreduce._hvdx_synchronize_dense`);
   no NaN/Inf agreement: no residual is at stake, and Horovod has none.
"""

from __future__ import annotations

import weakref
from typing import Dict, Tuple

import horovod.torch as _hvd
import torch

__all__ = ["DenseAllreduce"]


class DenseAllreduce:
    """Methods of the compression driver's optimizer class (:mod:`hvdx.torch.compression_driver`)
    for Horovod's allreduce (module docstring). It owns the allreduce's settings, the
    handles the backward pass started (``{position: (handle, was_sparse)}``), the
    passes each gradient still awaits and the hooks; it reads the optimizer's
    ``_hvdx_entries``, ``_hvdx_sync`` and ``backward_passes_per_step``, and a dense
    step with momentum correction ends with its weight decay and momentum
    (:class:`~hvdx.torch.momentum_correction.MomentumCorrection`)."""

    def _hvdx_init_dense(self, op, gradient_predivide_factor, process_set) -> None:
        self._hvdx_op = op
        self._hvdx_predivide = gradient_predivide_factor
        self._hvdx_process_set = process_set
        self._hvdx_handles: Dict[int, Tuple] = {}
        self._hvdx_delay: Dict[int, int] = {}
        self._hvdx_hooks = None

    def _hvdx_passes_changed(self, passes):
        self._hvdx_delay = dict.fromkeys(self._hvdx_delay, passes)

    def _hvdx_forget_started(self):
        """A loaded state: no allreduce is pending, and every gradient awaits all its
        passes again."""
        self._hvdx_handles.clear()
        self._hvdx_delay = dict.fromkeys(self._hvdx_delay, self.backward_passes_per_step)

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
        if self._hvdx_momentum:
            self._hvdx_weight_decay()
            self._hvdx_after_exchange([])

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
