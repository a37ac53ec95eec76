"""Horovod's checks of ``named_parameters``, shared by every hvdx strategy.

Horovod's ``DistributedOptimizer`` checks ``named_parameters`` in its constructor and
keeps ``{parameter: name}`` as ``optimizer._parameter_names`` (Horovod's own tests and
some scripts read it). hvdx's optimizers (TopK, DS-Sync, decentralized SGD) get the same
checks, with Horovod's messages, from :func:`parameter_names`, which
:func:`hvdx.torch.DistributedOptimizer` calls once for whichever strategy runs: before
anything collective, so a script that passes a wrong list fails on every rank alike
(every rank runs the same script) instead of leaving the others waiting.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch

__all__ = ["parameter_names", "positional_name"]


def positional_name(group: int, index: int) -> str:
    """The name hvdx gives the ``index``-th parameter of parameter group ``group`` when
    ``named_parameters`` is not given: unique over all groups and the same on every rank
    (the fingerprint, TopK's residuals and checkpoints are keyed by it)."""
    return f"param_groups[{group}][{index}]"


def parameter_names(param_groups: Iterable[Mapping],
                    named_parameters: Optional[Sequence[Tuple[str, torch.Tensor]]]
                    ) -> Dict[torch.Tensor, str]:
    """``{parameter: name}`` for the optimizer's ``param_groups``, as Horovod 0.28.1's
    ``_DistributedOptimizer.__init__`` checks and builds it.

    1. ``named_parameters=None``: every parameter is named by its position
       (:func:`positional_name`; Horovod's own names are ``allreduce.noname.{i}.{j}``,
       hvdx keeps the names its fingerprint and checkpoints already use);
    2. every entry must be a ``(name, parameter)`` tuple;
    3. the names must be unique (two tensors under one name would be mixed up across
       ranks: residuals, allreduces and checkpoints are keyed by name);
    4. every parameter of the optimizer must be named (a parameter without a name has
       no place in the exchange). Names of tensors the optimizer does not hold are
       allowed, as in Horovod (``model.named_parameters()`` with an optimizer over
       part of the model).

    Raises:
        ValueError: Horovod's message for steps 2 to 4.
    """
    param_groups = list(param_groups)
    if named_parameters is None:
        named: List[Tuple[str, torch.Tensor]] = [
            (positional_name(g, i), p) for g, group in enumerate(param_groups)
            for i, p in enumerate(group["params"])]
    else:
        named = list(named_parameters)
    if any(not isinstance(entry, tuple) for entry in named):
        raise ValueError('named_parameters should be a sequence of '
                         'tuples (name, parameter), usually produced by '
                         'model.named_parameters().')
    seen, duplicates = set(), set()
    for name, _ in named:
        if name in seen:
            duplicates.add(name)
        seen.add(name)
    if duplicates:
        raise ValueError('Parameter names in named_parameters must be unique. '
                         'Found duplicates: %s' % ', '.join(duplicates))
    # Sets built as Horovod builds them: the ids come out in the same order, so the
    # message is Horovod's character for character.
    all_ids = {id(p) for group in param_groups for p in group["params"]}
    unnamed = all_ids - {id(p) for _, p in named}
    if unnamed:
        raise ValueError('named_parameters was specified, but one or more model '
                         'parameters were not named. Python object ids: '
                         '%s' % ', '.join(str(i) for i in unnamed))
    # Horovod builds it from the sorted list: the same dict, in the same order.
    return {p: name for name, p in sorted(named, key=lambda entry: entry[0])}
