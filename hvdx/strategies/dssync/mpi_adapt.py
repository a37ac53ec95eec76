"""DS-Sync that follows the network: rerun the bandwidth probe, rebuild the rotation.

DS-Sync (Wang et al., "Divide-and-Shuffle Synchronization for Distributed Machine
Learning", arXiv 2007.03298) places its groups so that their traffic avoids the slow
links. Links change during training (a contended uplink, a busy NIC), so with
``hvdx.DSSync(probe_every=K)`` the framework adapters call
:meth:`DSSyncAdaptation.maybe_adapt` at every step ``t``, on every rank:

1. at ``t = K, 2K, ...`` (the same steps on every rank, since every rank counts the
   same steps) the probe runs, collectively: :func:`hvdx.mpi.probe.probe_bandwidth`,
   whose matrix is allgathered, or the user's ``DSSync(probe=fn)``, called on rank 0
   and broadcast. Either way every rank holds the same matrix;
2. :func:`hvdx.core.bandwidth.adapted_rotation` derives the racks (kept when they came
   from labels or from ``DSSync(topology=...)``; a host with a slowed NIC would
   otherwise look like a rack of its own), the slow links and who crosses in each rack,
   and builds the rotation they call for. A pure function of the shared matrix: every
   rank takes the same decision;
3. if that rotation uses other groups than the running one, it is returned; the
   adapter swaps it in and registers its process sets (collective, same step on every
   rank), the change is counted (``adaptations``) and rank 0 logs one line.

:meth:`state` / :meth:`restore` keep the adapted topology in the optimizer's
``state_dict``, so a resumed run continues on the schedule it had.
"""

from __future__ import annotations

import sys
import time
from typing import Dict, List, Optional

import numpy as np

from hvdx.core.bandwidth import adapted_rotation, rotation_on
from hvdx.core.topology import Topology
from hvdx.strategies.dssync.core_schedule import RotationSchedule

__all__ = ["DSSyncAdaptation"]


class DSSyncAdaptation:
    """The probe-and-rebuild loop of one DS-Sync run (module docstring).

    Args:
        sync: the user's :class:`hvdx.DSSync` (``probe_every``, ``probe_bytes``,
            ``probe``, ``cross_ranks``).
        comm: an mpi4py communicator over the job's ranks in Horovod's rank order.
        keep_racks: keep the running topology's racks (labels or ``topology=``).
    """

    def __init__(self, sync, comm, keep_racks: bool):
        self.sync = sync
        self.comm = comm
        self.keep_racks = bool(keep_racks)
        self.rank = comm.Get_rank()
        #: Probes run, rotations changed, and seconds spent probing on this rank.
        self.probes = 0
        self.adaptations = 0
        self.probe_seconds = 0.0
        #: One entry per change: step, crossing ranks per rack, slow links.
        self.history: List[Dict] = []
        self._adapted: Optional[Dict] = None

    @classmethod
    def create(cls, sync, global_process_set) -> Optional["DSSyncAdaptation"]:
        """The loop for ``sync``, or ``None`` with ``probe_every=0``. Collective."""
        if not getattr(sync, "probe_every", 0):
            return None
        from hvdx.mpi.comm import world
        from hvdx.mpi.topology import rack_labels

        comm = world(global_process_set)
        keep = sync.topology is not None or rack_labels(comm) is not None
        return cls(sync, comm, keep)

    def due(self, step: int) -> bool:
        """Whether ``step`` probes (step 1 of the module docstring)."""
        every = self.sync.probe_every
        return bool(every) and step > 0 and step % every == 0

    def maybe_adapt(self, step: int, schedule: RotationSchedule
                    ) -> Optional[RotationSchedule]:
        """Steps 1-3: the new rotation at a probing step if it differs, else ``None``."""
        if not self.due(step):
            return None
        started = time.perf_counter()
        matrix = self._matrix(step, schedule.topology)
        measured, new = adapted_rotation(schedule, matrix, self.keep_racks,
                                         self._cross_ranks(schedule))
        self.probes += 1
        self.probe_seconds += time.perf_counter() - started
        if new is None:
            return None
        self.adaptations += 1
        crossing = measured.crossing(new.cross_ranks)
        self.history.append({"step": step, "crossing": crossing,
                             "slow_links": measured.slow_links})
        self._adapted = {"hosts": list(measured.topology.hosts),
                         "racks": list(measured.topology.racks),
                         "places": list(measured.places), "adaptations": self.adaptations}
        if self.rank == 0:
            print(f"[hvdx] DS-Sync step {step}: rotation rebuilt from the probe "
                  f"(racks {list(map(list, measured.topology.rack_groups()))}, crossing "
                  f"{list(map(list, crossing))}, {len(measured.slow_links)} slow links)",
                  file=sys.stderr, flush=True)
        return new

    def state(self) -> Optional[Dict]:
        """The adapted topology to checkpoint, or ``None`` if nothing changed yet."""
        return None if self._adapted is None else dict(self._adapted)

    def restore(self, state: Optional[Dict], schedule: RotationSchedule
                ) -> Optional[RotationSchedule]:
        """The rotation saved by :meth:`state` (``None``: keep ``schedule``)."""
        if not state:
            return None
        self._adapted = dict(state)
        self.adaptations = int(state.get("adaptations", self.adaptations))
        topology = Topology(tuple(state["hosts"]), tuple(state["racks"]))
        return rotation_on(schedule, topology, state["places"], self._cross_ranks(schedule))

    def _cross_ranks(self, schedule: RotationSchedule) -> int:
        """Ranks per rack that cross: the user's, else the running rotation's (which
        the cost of crossing may have set from the link rates; a probe moves who
        crosses, not how many)."""
        return self.sync.cross_ranks if self.sync.cross_ranks is not None \
            else schedule.cross_ranks

    def _matrix(self, step: int, topology: Topology) -> np.ndarray:
        """Step 1: the same matrix on every rank."""
        if self.sync.probe is not None:
            # The user's source may differ between ranks: rank 0's answer counts.
            matrix = np.asarray(self.sync.probe(step), dtype=np.float64) \
                if self.rank == 0 else None
            return self.comm.bcast(matrix, root=0)
        from hvdx.mpi.probe import probe_bandwidth

        return probe_bandwidth(self.comm, self.sync.probe_bytes, list(topology.hosts)).matrix
