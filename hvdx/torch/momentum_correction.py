"""DGC's momentum correction, a capability of the PyTorch compression driver
(:mod:`hvdx.torch.compression_driver`) that TopK asks for: the velocity is the memory.

Lin, Han, Mao, Wang & Dally, "Deep Gradient Compression", arXiv 1712.01887, with
``momentum_correction=True`` (the wrapped optimizer must be ``torch.optim.SGD`` without
Nesterov or dampening): hvdx takes the momentum ``m`` and weight decay ``wd`` of each
parameter group over. Around the exchange of
:class:`~hvdx.strategies.topk.mpi_driver.TopKSynchronizer`:

1. before it (after the NaN/Inf agreement: a NaN in the velocity would never leave
   it): ``g <- g + wd p`` for every dense gradient; a compressed tensor's gradient
   becomes its local velocity ``v <- m v + g``, which the exchange compresses
   (:meth:`MomentumCorrection._hvdx_local_momentum`). The compressed tensors'
   velocities are views of one flat buffer, which ``selection="global"`` reads as its
   concatenation (no copy);
2. after it: ``v`` is zeroed where this rank sent it (factor masking;
   ``momentum_masking=False`` keeps it); a dense tensor is averaged first and then gets
   ``v <- m v + avg``, SGD's own momentum (:meth:`MomentumCorrection._hvdx_after_exchange`);
3. the wrapped step runs with momentum and weight decay 0
   (:meth:`MomentumCorrection._hvdx_local_step`).

So tensors left dense train exactly as SGD with momentum under Horovod; at ``ratio=1``
a compressed tensor sends its whole velocity, which masking then clears: plain SGD on
the average (without masking: SGD with momentum on the average). The velocities are
state like the residuals: in ``state_dict`` (:meth:`MomentumCorrection._hvdx_velocity_state`),
and a broadcast copies those of the dense tensors, which are the same on every rank by
design (:meth:`MomentumCorrection._hvdx_broadcast_dense_velocity`).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import horovod.torch as _hvd
import torch

from hvdx.strategies.topk.presets import momentum_correction_refusal

__all__ = ["MomentumCorrection", "check_momentum_correction"]


class MomentumCorrection:
    """Methods of the compression driver's optimizer class (:mod:`hvdx.torch.compression_driver`)
    for steps 1 to 3 above. It owns ``_hvdx_velocity`` and ``_hvdx_flat_velocity``, and
    reads the optimizer's ``_hvdx_entries`` (``(name, parameter)`` in the fixed order),
    ``_hvdx_sync`` and ``param_groups``."""

    def _hvdx_init_momentum(self, compression) -> None:
        #: Whether the strategy asks for momentum correction (a capability: TopK's
        #: ``momentum_correction=True``; a registered compressor has none).
        self._hvdx_momentum = bool(getattr(compression, "momentum_correction", False))
        self._hvdx_velocity: Dict[str, torch.Tensor] = {}
        #: Momentum correction: ``(names, buffer)``, the velocities of the compressed
        #: tensors as views of one flat buffer in their fixed order, which the exchange
        #: then reads as one array (no copy into ``p.grad``, no concatenation).
        self._hvdx_flat_velocity: Optional[Tuple[Tuple[str, ...], torch.Tensor]] = None
        if self._hvdx_momentum:
            check_momentum_correction(self)

    def _hvdx_local_step(self, closure=None):
        """The wrapped optimizer's own step on ``p.grad``, with no communication (with
        momentum correction, without its momentum and weight decay)."""
        if not self._hvdx_momentum:
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
        sent = self._hvdx_sync.last_sent if self._hvdx_spec.momentum_masking \
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

    def _hvdx_dense_names(self):
        """The names of the tensors the next step leaves dense (sparse gradients
        aside, which keep no velocity)."""
        dense, _ = self._hvdx_sync.split([p.numel() for _, p in self._hvdx_entries])
        return {self._hvdx_entries[position][0] for position in dense}

    def _hvdx_velocity_state(self) -> Dict[str, torch.Tensor]:
        """Copies of the velocities, for ``state_dict``."""
        return {n: v.detach().clone() for n, v in self._hvdx_velocity.items()}

    def _hvdx_load_velocity(self, saved) -> None:
        """The velocities of a loaded ``state_dict``, on the parameters' devices."""
        params = dict(self._hvdx_entries)
        self._hvdx_velocity = {
            n: v.detach().to(params[n].device, params[n].dtype).clone()
            for n, v in saved.items() if n in params}

    def _hvdx_broadcast_dense_velocity(self, root_rank) -> None:
        """Give every rank ``root_rank``'s velocity of every tensor the next step leaves
        dense (below ``min_size``, during warm-up or autotune, or once autotune chose
        dense): SGD's momentum of the *average*, the same on every rank by design, so a
        rank that kept its own would apply another update from then on. Collective."""
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


def check_momentum_correction(optimizer) -> None:
    """``momentum_correction`` takes SGD's momentum over: SGD without Nesterov or
    dampening only (anything else would be applied twice or differently). The same test
    decides whether a preset keeps it (:func:`hvdx.strategies.topk.presets.for_optimizer`)."""
    refusal = momentum_correction_refusal(optimizer._hvdx_base.__name__,
                                          optimizer.param_groups)
    if refusal is not None:
        raise ValueError(refusal)

