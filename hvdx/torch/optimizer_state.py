"""``hvd.broadcast_optimizer_state`` for hvdx's optimizers too (Horovod's resume recipe).

Horovod's recipe for resuming from a checkpoint that rank 0 alone reads::

    if hvd.rank() == 0:
        state = torch.load(path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

Horovod's ``broadcast_optimizer_state`` first gives an optimizer whose state is still
empty (every rank but 0 here) a state, by stepping it on zero gradients. It steps its
own optimizer class without communication, but any other wrapper through ``step()``:
for hvdx's optimizers that is a collective step which rank 0, whose state is loaded,
never joins, and the job hangs. This module's version, for an hvdx optimizer:

1. an empty state is created by the wrapped optimizer's own step on zero gradients,
   with no communication; the zero gradients stay, as Horovod leaves them, and the
   parameters are put back as they were (Horovod's zero-gradient step would move them by
   weight decay after ``broadcast_parameters``);
2. Horovod's ``broadcast_optimizer_state`` then broadcasts the wrapped optimizer's state
   and options (its state is no longer empty, so it steps nothing);
3. the part of hvdx's own state that every rank must hold alike (the schedule's step,
   TopK's server residuals in ``gathered`` mode, autotune's choice, SWA) is broadcast
   too. Each rank keeps what is its own by design: TopK's worker residuals and
   velocities.

Any other optimizer goes to Horovod's function unchanged, so results stay Horovod's.
"""

from __future__ import annotations

import horovod.torch as _hvd
import torch

__all__ = ["broadcast_optimizer_state"]


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Broadcast an optimizer's state from ``root_rank`` to every rank (collective).

    Takes the arguments of ``horovod.torch.broadcast_optimizer_state``: the optimizer
    (Horovod's, hvdx's or a plain ``torch.optim`` one), the root rank, and optionally
    the model (to find sparse embeddings). Steps 1-3 of the module docstring.
    """
    if not hasattr(optimizer, "_hvdx_broadcast_shared"):
        return _hvd.broadcast_optimizer_state(optimizer, root_rank, model=model)
    if len(optimizer.state_dict()["state"]) == 0:
        _create_state(optimizer, model)
    if len(optimizer.state_dict()["state"]):
        # Not for a stateless optimizer (plain SGD): Horovod would step it again.
        _hvd.broadcast_optimizer_state(optimizer, root_rank, model=model)
    optimizer._hvdx_broadcast_shared(root_rank)


def _create_state(optimizer, model) -> None:
    """Step 1: the wrapped optimizer's step on zero gradients (Horovod's, sparse
    gradients included), the parameters restored afterwards."""
    sparse = set()
    if model is not None:
        for m in model.modules():
            if isinstance(m, torch.nn.Embedding) and m.sparse:
                sparse.update(id(p) for p in m.parameters())
    kept = []
    with torch.no_grad():
        for group in optimizer.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                kept.append((p, p.detach().clone()))
                zero = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam) or \
                        (isinstance(optimizer, torch.optim.SGD) and id(p) in sparse):
                    zero = zero.to_sparse()
                p.grad = zero
        try:
            optimizer._hvdx_local_step()
        finally:
            for p, value in kept:
                p.copy_(value)
