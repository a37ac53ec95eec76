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
2. every rank's state takes the root's *shape*: the parameters that hold state and the
   entries each holds (one small broadcast of names, shapes and dtypes; an entry the
   root lacks is dropped, one it has is created as zeros). Horovod's function
   broadcasts state entry by entry under names counted on each rank, so ranks whose
   states differ in shape would wait for each other forever. They do whenever a
   parameter has no gradient: a parameter-mixing strategy steps on local gradients,
   so the root's loaded optimizer has no state for a parameter that never had a
   gradient, while step 1 gave one to every parameter of the other ranks;
3. Horovod's ``broadcast_optimizer_state`` then broadcasts the wrapped optimizer's state
   and options (its state is no longer empty, so it steps nothing);
4. the part of hvdx's own state that every rank must hold alike (the schedule's step,
   TopK's server residuals in ``gathered`` mode, autotune's choice, SWA) is broadcast
   too. Each rank keeps what is its own by design: TopK's worker residuals and
   velocities.

Any other optimizer goes to Horovod's function unchanged, so results stay Horovod's.
"""

from __future__ import annotations

from typing import Dict

import horovod.torch as _hvd
import torch

from hvdx import log

__all__ = ["broadcast_optimizer_state", "say_once_per_job"]

_said = set()


def say_once_per_job(text: str) -> None:
    """``text`` on rank 0 (:func:`hvdx.log.say`), once per process."""
    if text not in _said:
        _said.add(text)
        log.say(text)


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Broadcast an optimizer's state from ``root_rank`` to every rank (collective).

    Takes the arguments of ``horovod.torch.broadcast_optimizer_state``: the optimizer
    (Horovod's, hvdx's or a plain ``torch.optim`` one), the root rank, and optionally
    the model (to find sparse embeddings). Steps 1-4 of the module docstring.
    """
    if not hasattr(optimizer, "_hvdx_broadcast_shared"):
        return _hvd.broadcast_optimizer_state(optimizer, root_rank, model=model)
    if not any(optimizer.state.values()):
        _create_state(optimizer, model)
    root_shape = _hvd.broadcast_object(_state_shape(optimizer), root_rank,
                                       name="hvdx.optimizer_state.shape")
    _take_shape(optimizer, root_shape)
    if root_shape:
        # Not for a stateless optimizer (plain SGD): Horovod would step it again.
        _hvd.broadcast_optimizer_state(optimizer, root_rank, model=model)
    optimizer._hvdx_broadcast_shared(root_rank)


def _parameters(optimizer):
    """The optimizer's parameters in ``param_groups`` order (``state_dict``'s ids)."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def _state_shape(optimizer) -> Dict[int, Dict[str, tuple]]:
    """``{position: {key: description}}`` of the state this rank holds: a tensor as
    ``("tensor", shape, dtype, on_cpu)``, anything else as ``("value", its type)``."""
    shape = {}
    for position, p in enumerate(_parameters(optimizer)):
        entries = optimizer.state.get(p)
        if not entries:
            continue
        shape[position] = {
            key: ("tensor", tuple(v.shape), str(v.dtype).replace("torch.", ""),
                  v.device.type == "cpu") if torch.is_tensor(v) else ("value", type(v))
            for key, v in entries.items()}
    return shape


def _take_shape(optimizer, root_shape) -> None:
    """Step 2: drop the state entries the root lacks and create those it has as zeros
    (a tensor on the CPU where the root's is, else on the parameter's device); their
    values come from the root in step 3."""
    for position, p in enumerate(_parameters(optimizer)):
        wanted = root_shape.get(position)
        if not wanted:
            optimizer.state.pop(p, None)
            continue
        entries = optimizer.state[p]  # a defaultdict: creates the parameter's entry
        for key in [k for k in entries if k not in wanted]:
            del entries[key]
        for key, description in wanted.items():
            if description[0] == "tensor":
                _, size, dtype, on_cpu = description
                have = entries.get(key)
                if torch.is_tensor(have) and tuple(have.shape) == size and \
                        str(have.dtype).replace("torch.", "") == dtype:
                    continue
                entries[key] = torch.zeros(size, dtype=getattr(torch, dtype),
                                           device="cpu" if on_cpu else p.device)
            elif key not in entries or type(entries[key]) is not description[1]:
                # A number (Horovod broadcasts it in a tensor) or None: its type's
                # default stands in until then.
                entries[key] = description[1]()


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
