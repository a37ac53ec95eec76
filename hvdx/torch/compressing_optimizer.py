"""Horovod's optimizer surface, once for every compression strategy's torch optimizer.

The compression driver (:mod:`hvdx.torch.compression_driver`), which runs TopK and
registered compressors, replaces Horovod's gradient allreduce by their own
exchange, and keep what a Horovod script calls on the optimizer:

1. the trained parameters, by name (``named_parameters``, else ``param_groups[g][i]``),
   in the optimizer's order, the same on every rank (:meth:`_hvdx_trained_entries`);
2. ``backward_passes_per_step`` and :meth:`set_backward_passes_per_step`;
3. :meth:`skip_synchronize`, and :meth:`step`: synchronize unless done or skipped, then
   the wrapped optimizer's own step, with Horovod's warning, word for word, when
   ``step()`` follows ``synchronize()`` outside ``skip_synchronize()``.

A strategy's class derives from :class:`CompressingOptimizer` and is made a run-time
subclass of the user's optimizer class (:func:`hvdx.torch.wrapping.subclass_of`); it
gives ``synchronize`` and may override ``_hvdx_local_step`` and ``_hvdx_passes_changed``.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import List, Tuple

import torch

__all__ = ["CompressingOptimizer", "STEP_AFTER_SYNCHRONIZE"]

#: Horovod's warning (torch/optimizer.py), which scripts and Horovod's tests look for.
STEP_AFTER_SYNCHRONIZE = (
    "optimizer.step() called without optimizer.skip_synchronize() context after "
    "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
    "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in "
    "your code.")


class CompressingOptimizer:
    """Methods shared by the compression strategies' run-time optimizer classes
    (module docstring); ``self._hvdx_base`` is the user's class."""

    def _hvdx_init_surface(self, named_parameters,
                           backward_passes_per_step) -> List[Tuple[str, torch.Tensor]]:
        """Set the surface's state; return the trained parameters by name (step 1)."""
        names = {id(p): n for n, p in named_parameters or ()}
        entries = []
        for g, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                if p.requires_grad:
                    entries.append((names.get(id(p), f"param_groups[{g}][{i}]"), p))
        self.backward_passes_per_step = backward_passes_per_step
        self._hvdx_synchronized = False
        self._hvdx_should_synchronize = True
        return entries

    def set_backward_passes_per_step(self, passes):
        if passes <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = passes
        self._hvdx_passes_changed(passes)

    def _hvdx_passes_changed(self, passes) -> None:
        """What a strategy counts per pass starts again from ``passes``."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside, :meth:`step` does not synchronize (call :meth:`synchronize` first)."""
        self._hvdx_should_synchronize = False
        try:
            yield
        finally:
            self._hvdx_should_synchronize = True

    def step(self, closure=None):
        """Synchronize (unless done or skipped), then the wrapped optimizer's step.

        After :meth:`synchronize` outside :meth:`skip_synchronize`, Horovod's warning.
        Horovod then synchronizes again, averaging the averages; a compression strategy
        does not: a second exchange would compress the update again and move the
        residuals.
        """
        if self._hvdx_should_synchronize and self._hvdx_synchronized:
            warnings.warn(STEP_AFTER_SYNCHRONIZE)
        if self._hvdx_should_synchronize and not self._hvdx_synchronized:
            self.synchronize()
        self._hvdx_synchronized = False
        return self._hvdx_local_step(closure)

    def _hvdx_local_step(self, closure=None):
        """The wrapped optimizer's own step on ``p.grad``, with no communication."""
        return self._hvdx_base.step(self, closure)
