"""DS-Sync for PyTorch: local steps, then parameter averaging inside Horovod process sets.

DS-Sync (Wang et al., "Divide-and-Shuffle Synchronization for Distributed Machine
Learning", arXiv 2007.03298); the numpy reference is
:func:`hvdx.core.group_averaging.simulate_dssync`. The optimizer is the shared
parameter-mixing wrapper (:mod:`hvdx.torch.mixing_optimizer`) with the
:class:`GroupMixer` below. ``step()`` does, at step ``t`` on every rank:

1. the wrapped optimizer's own step on the local gradients (no gradient communication);
2. an average of the parameters (with ``average_optimizer_state``, also of the
   optimizer's per-parameter tensors; with ``named_buffers``, also of the model's
   floating-point buffers) over this rank's group of ``partition(t)``,
   by ``hvd.grouped_allreduce_(op=Average)`` on the group's process set, one call per
   dtype, tensors in the optimizer's parameter order. A rank alone in its group sends
   nothing. Every ``global_every``-th step averages over all ranks instead;
3. with ``swa_start``, from step ``swa_start`` on (every ``swa_every`` steps) the
   averaged parameters join this rank's running mean (SWA; Izmailov et al., arXiv
   1803.05407), which ``synchronize_parameters(swa=True)`` finally averages over all
   ranks into the parameters (the paper's final merge);
4. ``t += 1``.

Process sets (:class:`hvdx.strategies.dssync.mpi_groups.DSSyncGroups`, shared with TensorFlow):
the groups a periodic schedule uses are registered once, at construction, in sorted
order on every rank (a group of all ranks is ``hvd.global_process_set``). A shuffle
schedule registers the groups of the next :data:`LOOKAHEAD` steps whenever a step needs
a group not registered yet. Registration needs ``hvd.init(process_sets="dynamic")``,
or a static registration of :func:`dssync_process_sets` at ``hvd.init``.
"""

from __future__ import annotations

from typing import List, Sequence

import horovod.torch as _hvd
import torch

from hvdx.strategies.dssync.mpi_groups import LOOKAHEAD, DSSyncGroups, DSSyncStats, static_groups
from hvdx.strategies.dssync.spec import DSSync
from hvdx.torch.mixing_optimizer import (MixerDefaults, average_over_all_ranks,
                                         make_mixing_optimizer, tensor_bytes)

__all__ = ["DSSyncStats", "GroupMixer", "LOOKAHEAD", "STATE_KEY", "adapter",
           "dssync_process_sets", "make_dssync_optimizer"]

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


def make_dssync_optimizer(optimizer, named_parameters, sync: DSSync, schedule,
                          named_buffers=None):
    """An instance of a class made at run time from ``optimizer``'s class.

    ``isinstance(result, type(optimizer))`` holds. Collective: registers process sets.
    """
    return make_mixing_optimizer(optimizer, named_parameters, sync,
                                 GroupMixer(sync, schedule), named_buffers, STATE_KEY,
                                 _DSSyncMethods)


class _DSSyncMethods:
    """DS-Sync's own members of the optimizer (the groups and their schedule)."""

    _hvdx_groups = property(lambda self: self._hvdx_mixer.groups)
    _hvdx_schedule = property(lambda self: self._hvdx_mixer.groups.schedule)
    hvdx_groups = property(lambda self: self._hvdx_mixer.groups,
                           doc="The groups, their schedule and process sets "
                           "(:class:`~hvdx.strategies.dssync.mpi_groups.DSSyncGroups`), "
                           "read-only.")


class GroupMixer(MixerDefaults):
    """DS-Sync's mixer: an average inside this rank's group of the step's partition.

    Synchronous (Horovod's grouped allreduce on the group's process set): nothing stays
    in flight. The groups, process sets, step and counters are
    :class:`~hvdx.strategies.dssync.mpi_groups.DSSyncGroups` (shared with TensorFlow).
    """

    def __init__(self, sync: DSSync, schedule):
        self.groups = DSSyncGroups(sync, schedule, _hvd)  # collective: registers sets
        self.stats = self.groups.stats

    step = property(lambda self: self.groups.step,
                    lambda self, value: setattr(self.groups, "step", value))
    swa_count = property(lambda self: self.groups.swa_count,
                         lambda self, value: setattr(self.groups, "swa_count", value))

    def mix(self, tensors: List[torch.Tensor], step: int, everyone: bool) -> None:
        # group_at also runs the probe at probing steps and answers all ranks at the
        # global_every steps (the same hvdx.strategy.global_due as ``everyone``).
        group = self.groups.group_at(step)
        self.groups.record(group, tensor_bytes(tensors))
        if len(group) >= 2:
            average_over_all_ranks(tensors, self.groups.tensor_prefix(group),
                                   self.groups.process_set(group))

    def count_everyone(self, tensors: Sequence[torch.Tensor]) -> None:
        self.groups.record(self.groups.all_ranks, tensor_bytes(tensors))

    def state(self):
        return self.groups.state()

    def load_state(self, state) -> None:
        self.groups.load_state(state)


def adapter(optimizer, sync: DSSync, plan, args):
    """DS-Sync's adapter in :mod:`hvdx.torch.registry` (the catalogue names it)."""
    return make_dssync_optimizer(optimizer, args.named_parameters, sync, plan.schedule,
                                 args.named_buffers)
