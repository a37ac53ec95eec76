"""DS-Sync's mixer: each step, an average inside this rank's group of the step's
partition, through Horovod process sets.

DS-Sync (Wang et al., "Divide-and-Shuffle Synchronization for Distributed Machine
Learning", arXiv 2007.03298); the numpy reference is
:func:`hvdx.core.group_averaging.simulate_dssync`. A
:class:`hvdx.core.mixer_protocol.Mixer`, run by the shared mixing drivers of torch and
TensorFlow, which at step ``t`` on every rank:

1. take the wrapped optimizer's own step on the local gradients (no gradient
   communication);
2. ask :meth:`GroupMixer.exchange` for the step's :class:`~hvdx.core.mixer_protocol.Group`:
   this rank's group of ``partition(t)`` (every ``global_every``-th step all ranks), with
   its process set; with ``DSSync(probe_every=K)`` a probing step first reruns the
   bandwidth probe and may swap in a rebuilt rotation
   (:class:`~hvdx.strategies.dssync.mpi_groups.DSSyncGroups`);
3. average the parameters (with ``average_optimizer_state`` also the optimizer's
   per-parameter tensors, and the buffers given) in that group, by Horovod's
   ``grouped_allreduce(op=Average)`` on the group's process set, one call per dtype;
   a rank alone in its group sends nothing;
4. with ``swa_start``, add the averaged parameters to the SWA running mean; ``t += 1``.

Process sets: the groups a periodic schedule uses are registered once, when the driver
binds the mixer, in sorted order on every rank (a group of all ranks is Horovod's global
set); a shuffle schedule registers the groups of the next
:data:`~hvdx.strategies.dssync.mpi_groups.LOOKAHEAD` steps when a step needs one.
Registration needs ``hvd.init(process_sets="dynamic")``, or the sets of
:func:`dssync_process_sets` given to ``hvd.init``.
"""

from __future__ import annotations

from typing import Dict, List

from hvdx.core.mixer_protocol import Everyone, Group, Mixer
from hvdx.strategies.dssync.mpi_groups import DSSyncGroups, static_groups

__all__ = ["GroupMixer", "dssync_process_sets"]


def dssync_process_sets(sync, size: int) -> List[object]:
    """The process sets to pass to ``hvd.init(process_sets=...)`` for static mode (torch
    and TensorFlow alike: Horovod's ``ProcessSet`` is one class).

    Every group of two or more ranks, except the group of all ranks (Horovod's global
    set), in sorted order. Call before ``hvd.init`` with the job's size. A rotation
    without ``topology=`` detects it here from ``MPI.COMM_WORLD`` (collective).

    Raises:
        ValueError: for ``schedule="shuffle"``, whose groups are too many to register
            statically: use ``hvd.init(process_sets="dynamic")``.
    """
    from horovod.common.process_sets import ProcessSet

    return [ProcessSet(list(g)) for g in static_groups(sync, size)]


class GroupMixer(Mixer):
    """DS-Sync's mixer (module docstring). Its groups, process sets and counters are
    :class:`~hvdx.strategies.dssync.mpi_groups.DSSyncGroups`, made when the driver binds
    it (collective: it registers process sets)."""

    # The checkpoint entry keeps "adapted" beside "step", as it always has.
    state_entry = None
    views = {"hvdx_groups": "groups", "_hvdx_groups": "groups",
             "_hvdx_schedule": "schedule", "schedule": "schedule"}

    def __init__(self, sync, schedule):
        self.sync = sync
        self._schedule = schedule
        self.groups = None

    def bind(self, horovod) -> None:
        if self.groups is None:
            self.groups = DSSyncGroups(self.sync, self._schedule, horovod)
            self.stats = self.groups.stats

    @property
    def schedule(self):
        return self._schedule if self.groups is None else self.groups.schedule

    def exchange(self, step: int, everyone: bool) -> Group:
        # group_at answers all ranks at the global_every steps (the same
        # hvdx.strategy_contract.global_due as ``everyone``), and runs the probe at probing steps.
        groups = self.groups
        group = groups.group_at(step)
        return Group(group, groups.process_set(group) if len(group) >= 2 else None,
                     groups.tensor_prefix(group))

    def count(self, exchange, model_bytes: int, size: int, traffic=None) -> None:
        ranks = self.groups.all_ranks if isinstance(exchange, Everyone) else exchange.ranks
        self.groups.record(ranks, model_bytes)

    def state(self) -> Dict[str, object]:
        adaptation = self.groups.adaptation
        adapted = adaptation.state() if adaptation is not None else None
        return {} if adapted is None else {"adapted": adapted}

    def load_state(self, state: Dict[str, object]) -> None:
        # DSSyncGroups rebuilds a saved rotation at the next step (collective there).
        self.groups.load_state({"step": 0, **state})
