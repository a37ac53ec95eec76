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
3. ``t += 1``.

Process sets: the groups a periodic schedule uses are registered once, at
construction, in sorted order on every rank (a group of all ranks is
``hvd.global_process_set``). A shuffle schedule registers the groups of the next
:data:`LOOKAHEAD` steps whenever a step needs a group not registered yet. Registration
needs ``hvd.init(process_sets="dynamic")``, or a static registration of
:func:`dssync_process_sets` at ``hvd.init``.
"""

from __future__ import annotations

import contextlib
import os
from typing import Dict, List, Sequence, Tuple

import horovod.torch as _hvd
import torch
from horovod.torch import mpi_ops as _mpi_ops

from hvdx.core.dssync_schedule import ShuffleSchedule
from hvdx.dssync import DSSync
from hvdx.torch.wrapping import subclass_of

__all__ = ["DSSyncStats", "LOOKAHEAD", "STATE_KEY", "dssync_process_sets",
           "make_dssync_optimizer"]

#: Key of the DS-Sync entry in ``state_dict()``.
STATE_KEY = "hvdx_dssync"
#: Steps of a shuffle schedule whose groups are registered together.
LOOKAHEAD = 16


class DSSyncStats:
    """Bytes this rank sent (ring model: ``2(g-1)/g`` model copies in a group of ``g``)."""

    __slots__ = ("steps", "last_bytes", "total_bytes", "last_group_size")

    def __init__(self):
        self.steps = 0
        self.last_bytes = 0.0
        self.total_bytes = 0.0
        self.last_group_size = 1

    def _add(self, group_size: int, model_bytes: int):
        sent = 2.0 * (group_size - 1) / group_size * model_bytes
        self.steps += 1
        self.last_bytes = sent
        self.total_bytes += sent
        self.last_group_size = group_size

    def as_dict(self) -> Dict[str, float]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self):
        return f"DSSyncStats({self.as_dict()})"


def dssync_process_sets(sync: DSSync, size: int) -> List[_hvd.ProcessSet]:
    """The process sets to pass to ``hvd.init(process_sets=...)`` for static mode.

    Every group of two or more ranks, except the group of all ranks (Horovod's global
    set), in sorted order. Call before ``hvd.init`` with the job's size. A rotation
    without ``topology=`` detects it here from ``MPI.COMM_WORLD`` (collective).

    Raises:
        ValueError: for ``schedule="shuffle"``, whose groups are too many to register
            statically: use ``hvd.init(process_sets="dynamic")``.
    """
    if not isinstance(sync, DSSync):
        raise ValueError(f"sync={sync!r} must be a hvdx.DSSync")
    if sync.kind == "shuffle":
        raise ValueError("dssync_process_sets: schedule='shuffle' draws new groups every "
                         "step; call hvd.init(process_sets=\"dynamic\") instead")
    topology = None
    if sync.needs_topology and sync.topology is None:
        from hvdx.mpi.topology import detect_topology
        topology = detect_topology()
    schedule = sync.build(size, topology)
    return [_hvd.ProcessSet(list(g)) for g in schedule.groups() if len(g) < size]


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
        self._hvdx_size = _hvd.size()
        self._hvdx_rank = _hvd.rank()
        self._hvdx_step = 0
        self._hvdx_sets: Dict[Tuple[int, ...], _hvd.ProcessSet] = {}
        self.hvdx_stats = DSSyncStats()
        if isinstance(schedule, ShuffleSchedule):
            self._hvdx_ensure_sets(0)
        else:
            self._hvdx_register([g for g in schedule.groups() if len(g) < self._hvdx_size])

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
        step = self._hvdx_step
        every = self._hvdx_sync.global_every
        if every and (step + 1) % every == 0:
            group = tuple(range(self._hvdx_size))
        else:
            self._hvdx_ensure_sets(step)
            group = self._hvdx_schedule.group(step, self._hvdx_rank)
        self._hvdx_average(group)
        self._hvdx_step = step + 1
        return loss

    def synchronize_parameters(self):
        """Average parameters (and state, if configured) over all ranks now (collective).

        Does not advance the schedule.
        """
        self._hvdx_average(tuple(range(self._hvdx_size)))

    # --- state ----------------------------------------------------------------------

    def state_dict(self):
        state = self._hvdx_base.state_dict(self)
        state[STATE_KEY] = {"step": self._hvdx_step}
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        dssync = state_dict.pop(STATE_KEY, None)
        self._hvdx_base.load_state_dict(self, state_dict)
        if dssync is not None:
            self._hvdx_step = int(dssync["step"])

    # --- internals ------------------------------------------------------------------

    def _hvdx_tensors(self) -> List[torch.Tensor]:
        """Parameters, then (optionally) their state tensors, in a fixed order."""
        params = [p for group in self.param_groups for p in group["params"]
                  if p.requires_grad]
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
        model_bytes = sum(t.numel() * t.element_size() for t in tensors)
        self.hvdx_stats._add(len(group), model_bytes)
        if len(group) < 2:
            return
        if len(group) == self._hvdx_size:
            process_set = _hvd.global_process_set
        else:
            process_set = self._hvdx_sets[group]
        by_dtype: Dict[torch.dtype, List[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        members = "-".join(map(str, group))
        with torch.no_grad():
            for dtype, same in by_dtype.items():
                name = f"hvdx.dssync.{members}.{str(dtype).replace('torch.', '')}"
                _hvd.grouped_allreduce_(same, op=_hvd.Average, name=name,
                                        process_set=process_set)

    def _hvdx_ensure_sets(self, step: int):
        """Shuffle schedule: register the next LOOKAHEAD steps' groups when needed."""
        schedule = self._hvdx_schedule
        if not isinstance(schedule, ShuffleSchedule):
            return
        needed = [g for g in schedule.partition(step) if 1 < len(g) < self._hvdx_size]
        if all(g in self._hvdx_sets for g in needed):
            return
        ahead = schedule.groups_used(range(step, step + LOOKAHEAD))
        self._hvdx_register([g for g in ahead if len(g) < self._hvdx_size])

    def _hvdx_register(self, groups: Sequence[Tuple[int, ...]]):
        """Find or add a process set for every group, in the given order, on every rank.

        Every rank sees the same table of registered sets (registration is collective),
        so every rank adds the same sets in the same order, or raises the same error.
        """
        registered = _registered_sets()
        missing = [g for g in groups if g not in self._hvdx_sets and g not in registered]
        if missing and not _dynamic():
            raise ValueError(
                f"DS-Sync needs Horovod process sets for its groups ({len(missing)} not "
                f"registered, e.g. {list(missing[0])}). Call "
                "hvd.init(process_sets=\"dynamic\"), or pass "
                "process_sets=hvdx.torch.dssync_optimizer.dssync_process_sets(sync, size) to "
                "hvd.init.")
        for g in groups:
            if g in self._hvdx_sets:
                continue
            if g in registered:
                self._hvdx_sets[g] = registered[g]
            else:
                self._hvdx_sets[g] = _hvd.add_process_set(list(g))


def _registered_sets() -> Dict[Tuple[int, ...], _hvd.ProcessSet]:
    """Every process set Horovod holds now, by its ranks.

    Workaround: Horovod has no public lookup of registered sets, and
    ``add_process_set`` refuses a duplicate; this reads its own (internal) table.
    """
    table = _mpi_ops._basics._get_process_set_ids_and_ranks()
    out = {}
    for process_set_id, ranks in table.items():
        if process_set_id == 0:
            continue
        ps = _hvd.ProcessSet(list(ranks))
        ps.process_set_id = process_set_id
        out[tuple(ranks)] = ps
    return out


def _dynamic() -> bool:
    """Whether Horovod accepts ``add_process_set`` (``hvd.init(process_sets="dynamic")``)."""
    return os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS", "0").strip().lower() \
        not in ("", "0", "false", "no", "off")
