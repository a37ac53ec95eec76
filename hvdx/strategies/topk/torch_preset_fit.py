"""TopK's ``torch_fit`` (its descriptor's): a preset as it runs with the optimizer it
was given, and rank 0's one note of what that changed.

:func:`hvdx.torch.registry.fit` calls :func:`fit_preset` before the cross-rank check.
The decision is :func:`hvdx.strategies.topk.presets.for_optimizer`'s (the optimizer's
class and ``param_groups``, the same on every rank); what rank 0 has said is kept in
:data:`_SAID`, once per process, which tests clear.
"""

from __future__ import annotations

import sys
from typing import Optional, Set, Tuple

import horovod.torch as _hvd

from hvdx.strategies.topk.presets import for_optimizer

__all__ = ["fit_preset"]

#: ``(preset, reason)`` rank 0 has printed (once per process).
_SAID: Set[Tuple[Optional[str], str]] = set()


def fit_preset(spec, optimizer):
    """A TopK preset with this optimizer: DGC's momentum correction only where it
    applies, more sent with an adaptive optimizer
    (:func:`hvdx.strategies.topk.presets.for_optimizer`); rank 0 says once what it chose
    and why."""
    fitted, why = for_optimizer(spec, type(optimizer).__name__, optimizer.param_groups)
    if why is not None and (spec.preset, why) not in _SAID:
        _SAID.add((spec.preset, why))
        if _hvd.rank() == 0:
            print(f"[hvdx] topk(preset={spec.preset!r}) {why}; every other setting is the "
                  "preset's (an argument given with the preset, such as "
                  "momentum_correction=False or ratio=, is kept as given)",
                  file=sys.stderr, flush=True)
    return fitted
