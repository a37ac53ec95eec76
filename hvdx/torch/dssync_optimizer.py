"""DS-Sync for PyTorch: local steps, then parameter averaging inside Horovod process sets.

DS-Sync (Wang et al., "Divide-and-Shuffle Synchronization for Distributed Machine
Learning", arXiv 2007.03298); the numpy reference is
:func:`hvdx.core.group_averaging.simulate_dssync`. ``step()`` of the optimizer made
here does, at step ``t`` on every rank:

1. the wrapped optimizer's own step on the local gradients (no gradient communication);
2. an average of the parameters (with ``average_optimizer_state``, also of the
   optimizer's per-parameter tensors) over this rank's group of ``partition(t)``,
   by ``hvd.grouped_allreduce_(op=Average)`` on the group's process set, one call per
   dtype, tensors in the optimizer's parameter order. A rank alone in its group sends
   nothing. Every ``global_every``-th step averages over all ranks instead;
3. with ``swa_start``, from step ``swa_start`` on (every ``swa_every`` steps) the
   averaged parameters join this rank's running mean (SWA; Izmailov et al., arXiv
   1803.05407), which ``synchronize_parameters(swa=True)`` finally averages over all
   ranks into the parameters (the paper's final merge);
4. ``t += 1``.

Process sets (:class:`hvdx.mpi.dssync_groups.DSSyncGroups`, shared with TensorFlow):
the groups a periodic schedule uses are registered once, at construction, in sorted
order on every rank (a group of all ranks is ``hvd.global_process_set``). A shuffle
schedule registers the groups of the next :data:`LOOKAHEAD` steps whenever a step needs
a group not registered yet. Registration needs ``hvd.init(process_sets="dynamic")``,
or a static registration of :func:`dssync_process_sets` at ``hvd.init``.
"""

from __future__ import annotations

import contextlib
from typing import Dict, List, Optional, Sequence

import horovod.torch as _hvd
import torch

from hvdx.dssync import DSSync
from hvdx.mpi.dssync_groups import LOOKAHEAD, DSSyncGroups, DSSyncStats, static_groups
from hvdx.torch.wrapping import subclass_of

__all__ = ["DSSyncStats", "LOOKAHEAD", "STATE_KEY", "dssync_process_sets",
           "make_dssync_optimizer"]

#: Key of the DS-Sync entry in ``state_dict()``.
STATE_KEY = "hvdx_dssync"


def dssync_process_sets(sync: DSSync, size: int) -> List[_hvd.ProcessSet]:
    """The process sets to pass to ``hvd.init(process_sets=...)`` for static mode.

    Every group of two or more ranks, except the group of all ranks (Horovod's global
    set), in sorted order. Call before ``hvd.init`` with the job's size. A rotation
    without ``topology=`` detects it here from ``MPI.COMM_WORLD`` (collective).

    Raises:
        ValueError: for ``schedule="shuffle"``, whose groups are too many to register
            statically: use ``hvd.init(process_sets="dynamic")``.
    """
    return [_hvd.ProcessSet(list(g)) for g in static_groups(sync, size)]


def make_dssync_optimizer(optimizer, named_parameters, sync: DSSync, schedule):
    """An instance of a class made at run time from ``optimizer``'s class.

    ``isinstance(result, type(optimizer))`` holds. The base class is captured in the new
    class (``_hvdx_base``), never found through ``super(self.__class__, self)``, so
    subclassing the result does not recurse. Collective: registers process sets.
    """
    cls = subclass_of(optimizer, _DSSyncOptimizer)
    return cls(optimizer.param_groups, named_parameters, sync, schedule)


class _DSSyncOptimizer:
    """Methods copied into the run-time class; ``self._hvdx_base`` is the user's class."""

    def __init__(self, params, named_parameters, sync, schedule):
        self._hvdx_base.__init__(self, params)
        self._hvdx_sync = sync
        self._hvdx_schedule = schedule
        # Groups, process sets, step and byte counters: shared with TensorFlow.
        self._hvdx_groups = DSSyncGroups(sync, schedule, _hvd)
        self.hvdx_stats = self._hvdx_groups.stats
        #: SWA running mean of the parameters (created at the first sample).
        self._hvdx_swa: Optional[List[torch.Tensor]] = None

    # --- the public surface of Horovod's optimizer -----------------------------------

    def set_backward_passes_per_step(self, passes):
        """Accepted for compatibility: DS-Sync sends no gradients."""
        if passes <= 0:
            raise ValueError("backward_passes_per_step must be > 0")

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Accepted for compatibility: there is no gradient synchronization to skip."""
        yield

    def synchronize(self):
        """Nothing to do: DS-Sync averages parameters after the local step."""

    def step(self, closure=None):
        """Local step, then averaging inside this rank's group (module docstring)."""
        loss = self._hvdx_base.step(self, closure)
        groups = self._hvdx_groups
        self._hvdx_average(groups.group_at(groups.step))
        if groups.swa_due(groups.step):
            self._hvdx_swa_sample()
        groups.step += 1
        return loss

    def synchronize_parameters(self, swa: bool = False):
        """Average parameters (and state, if configured) over all ranks now (collective).

        Does not advance the schedule.

        Args:
            swa: first replace every rank's parameters by its SWA running mean
                (``DSSync(swa_start=...)``), so the result is the final SWA-style merge:
                the mean over ranks and sampled steps. Call it once, after training.

        Raises:
            ValueError: ``swa=True`` before the first sample (or without ``swa_start``),
                on every rank alike (every rank counts the same steps).
        """
        if swa:
            if not self._hvdx_groups.swa_count:
                raise ValueError(
                    "synchronize_parameters(swa=True): no SWA sample yet; set "
                    f"DSSync(swa_start=...) and train past it (swa_start="
                    f"{self._hvdx_sync.swa_start}, step {self._hvdx_groups.step})")
            with torch.no_grad():
                for p, mean in zip(self._hvdx_params(), self._hvdx_swa):
                    p.copy_(mean)
        self._hvdx_average(self._hvdx_groups.all_ranks)

    # --- state ----------------------------------------------------------------------

    def state_dict(self):
        state = self._hvdx_base.state_dict(self)
        state[STATE_KEY] = self._hvdx_groups.state()
        if self._hvdx_swa is not None:
            state[STATE_KEY]["swa"] = [t.clone() for t in self._hvdx_swa]
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        dssync = state_dict.pop(STATE_KEY, None)
        self._hvdx_base.load_state_dict(self, state_dict)
        if dssync is not None:
            self._hvdx_groups.load_state(dssync)
            if dssync.get("swa") is not None:
                self._hvdx_swa = [t.detach().clone().to(p.device)
                                  for t, p in zip(dssync["swa"], self._hvdx_params())]

    # --- internals ------------------------------------------------------------------

    def _hvdx_params(self) -> List[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]
                if p.requires_grad]

    def _hvdx_swa_sample(self):
        """Add the (group-averaged) parameters to the SWA running mean."""
        params = self._hvdx_params()
        if self._hvdx_swa is None:
            self._hvdx_swa = [torch.zeros_like(p) for p in params]
        count = self._hvdx_groups.swa_count
        with torch.no_grad():
            for mean, p in zip(self._hvdx_swa, params):
                # The reference's form (hvdx.core.group_averaging.running_mean).
                mean.copy_(mean + (p - mean) / (count + 1))
        self._hvdx_groups.swa_count = count + 1

    def _hvdx_tensors(self) -> List[torch.Tensor]:
        """Parameters, then (optionally) their state tensors, in a fixed order."""
        params = self._hvdx_params()
        tensors = [p.data for p in params]
        if self._hvdx_sync.average_optimizer_state:
            for p in params:
                state = self.state.get(p, {})
                for key in sorted(state):
                    value = state[key]
                    if key != "step" and torch.is_tensor(value) and \
                            value.is_floating_point() and value.shape == p.shape:
                        tensors.append(value)
        return tensors

    def _hvdx_average(self, group: Sequence[int]):
        group = tuple(group)
        tensors = self._hvdx_tensors()
        groups = self._hvdx_groups
        groups.record(group, sum(t.numel() * t.element_size() for t in tensors))
        if len(group) < 2:
            return
        process_set = groups.process_set(group)
        by_dtype: Dict[torch.dtype, List[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        with torch.no_grad():
            for dtype, same in by_dtype.items():
                name = groups.tensor_name(group, str(dtype).replace("torch.", ""))
                _hvd.grouped_allreduce_(same, op=_hvd.Average, name=name,
                                        process_set=process_set)
