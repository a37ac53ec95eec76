"""DS-Sync bookkeeping shared by the framework adapters: groups, process sets, step, bytes.

DS-Sync (Wang et al., "Divide-and-Shuffle Synchronization for Distributed Machine
Learning", arXiv 2007.03298) averages every rank's parameters inside its group of the
step's partition. What does not depend on the framework lives here; the adapters
(:mod:`hvdx.strategies.dssync.mixer`, run by the shared mixing drivers)
only gather their tensors and call Horovod's ``grouped_allreduce`` on
:meth:`DSSyncGroups.process_set`. At step ``t`` an adapter does:

1. ``group = groups.group_at(t)``: the rank's group of ``partition(t)``, or all ranks
   every ``global_every``-th step; for a shuffle schedule this first registers the
   process sets of the next :data:`LOOKAHEAD` steps if ``partition(t)`` needs one that
   is not registered yet (collective, and every rank takes the same decision, because
   every rank computes the same partitions). With ``DSSync(probe_every=K)``, steps
   ``K, 2K, ...`` first rerun the bandwidth probe and may swap in a rotation rebuilt
   from it (:mod:`hvdx.strategies.dssync.mpi_adapt`; collective, the same decision everywhere);
2. ``groups.record(group, model_bytes)`` (byte counters), then, for a group of two or
   more ranks, an average over ``groups.process_set(group)``. (The SWA running mean is
   the mixing wrapper's, the same for every mixing strategy.)

Horovod's process-set objects are framework-specific (``horovod.torch.ProcessSet`` and
``horovod.tensorflow.ProcessSet`` hold different basics), so the adapter passes its
Horovod module in; nothing here imports torch or TensorFlow.
"""

from __future__ import annotations

import atexit
import os
import time
from typing import Dict, List, Optional, Sequence, Tuple

from mpi4py import MPI

from hvdx.core.counters import Counters
from hvdx.core.fingerprint import Fingerprint
from hvdx.mpi.comm import world
from hvdx.mpi.consistency import check_consistent
from hvdx.strategies.dssync.core_link_rates import link_rates_from_environment
from hvdx.strategies.dssync.core_schedule import ShuffleSchedule
from hvdx.strategies.dssync.mpi_adapt import DSSyncAdaptation
from hvdx.strategy_contract import MixingStrategy, Strategy

__all__ = ["DSSyncGroups", "DSSyncStats", "LOOKAHEAD", "dynamic_process_sets",
           "registered_sets", "static_groups"]

#: Steps of a shuffle schedule whose groups are registered together.
LOOKAHEAD = 16


class DSSyncStats(Counters):
    """Bytes this rank sent (ring model: ``2(g-1)/g`` model copies in a group of ``g``)."""

    INITIAL = {"steps": 0, "last_bytes": 0.0, "total_bytes": 0.0, "last_group_size": 1,
               # DSSync(probe_every=K): probes run, rotations rebuilt (mpi_adapt).
               "probes": 0, "adaptations": 0, "last_adaptation_step": -1,
               "probe_seconds": 0.0}
    __slots__ = tuple(INITIAL)

    def record_adaptation(self, probes: int, probe_seconds: float,
                          adaptations: int, step: Optional[int] = None) -> None:
        """Take the adaptation's figures (``DSSync(probe_every=K)``): the probes run, the
        seconds they took and the rotations rebuilt; ``step``, where a rotation was
        rebuilt at it, becomes ``last_adaptation_step``."""
        self.probes, self.probe_seconds, self.adaptations = probes, probe_seconds, adaptations
        if step is not None:
            self.last_adaptation_step = step

    def record(self, group_size: int, model_bytes: int):
        """Count one step averaged in a group of ``group_size`` ranks: add the ring
        bytes of a ``model_bytes`` model to ``last_bytes`` and ``total_bytes``, one to
        ``steps``, and set ``last_group_size``."""
        sent = 2.0 * (group_size - 1) / group_size * model_bytes
        self.steps += 1
        self.last_bytes = sent
        self.total_bytes += sent
        self.last_group_size = group_size


class DSSyncGroups:
    """The groups of a DS-Sync run on this rank, and their Horovod process sets.

    Collective at construction: a periodic schedule registers all its groups of two or
    more ranks (except the group of all ranks, Horovod's global set) once, in sorted
    order on every rank; a shuffle schedule registers the groups of its first
    :data:`LOOKAHEAD` steps.

    Args:
        sync: the user's :class:`hvdx.DSSync`.
        schedule: ``sync.build(size, topology)``.
        horovod: Horovod's framework module (``horovod.torch`` or
            ``horovod.tensorflow``): ``size``, ``rank``, ``ProcessSet``,
            ``add_process_set``, ``global_process_set`` and ``mpi_ops._basics``.
    """

    def __init__(self, sync: MixingStrategy, schedule, horovod):
        self.sync = sync
        self.schedule = schedule
        self.size = horovod.size()
        self.rank = horovod.rank()
        _barrier_at_exit(horovod.global_process_set)
        #: Steps taken (the schedule's position); the adapters save and restore it.
        self.step = 0
        self.stats = DSSyncStats()
        #: Samples in the SWA running mean (the adapter holds the mean itself).
        self.swa_count = 0
        self._hvd = horovod
        self._sets: Dict[Tuple[int, ...], object] = {}
        if isinstance(schedule, ShuffleSchedule):
            self._ensure_sets(0)
        else:
            self._register([g for g in schedule.groups() if len(g) < self.size])
        # DSSync(probe_every=K): the probe-and-rebuild loop (collective to set up).
        self.adaptation = DSSyncAdaptation.create(sync, horovod.global_process_set)
        self._probed_step = -1
        #: A loaded adaptation's state, rebuilt at the next step (:meth:`load_state`).
        self._restored = None

    @property
    def all_ranks(self) -> Tuple[int, ...]:
        return tuple(range(self.size))

    @property
    def registered_groups(self) -> Tuple[Tuple[int, ...], ...]:
        """The groups this rank holds a Horovod process set for (the group of all ranks
        uses the global set and is not among them)."""
        return tuple(self._sets)

    def group_at(self, step: int) -> Tuple[int, ...]:
        """This rank's group at ``step`` (``global_every`` included); registers ahead.

        With ``probe_every``, a probing step first runs the probe and may swap in a
        rebuilt rotation (:meth:`_adapt`), on every rank alike.
        """
        self._adapt(step)
        if self.sync.global_due(step):  # decided by the spec, as for every mixer
            return self.all_ranks
        self._ensure_sets(step)
        return self.schedule.group(step, self.rank)

    def process_set(self, group: Sequence[int]):
        """The Horovod process set of ``group`` (two or more ranks, registered)."""
        group = tuple(group)
        if len(group) == self.size:
            return self._hvd.global_process_set
        return self._sets[group]

    def record(self, group: Sequence[int], model_bytes: int) -> None:
        """Count the bytes one average in ``group`` sends (zero for a group of one)."""
        self.stats.record(len(group), model_bytes)

    def state(self) -> Dict[str, int]:
        """The checkpointed position: ``{"step": t}``, plus ``"swa_count"`` with SWA,
        plus ``"adapted"`` (the measured topology) once the probe rebuilt the rotation."""
        state = {"step": self.step}
        if self.sync.swa_start is not None:
            state["swa_count"] = self.swa_count
        adapted = self.adaptation.state() if self.adaptation is not None else None
        if adapted is not None:
            state["adapted"] = adapted
        return state

    def load_state(self, state: Dict[str, int]) -> None:
        """Resume from :meth:`state`: the schedule continues where it was saved.

        Local, as loading a state dict is in torch: one rank may load alone (Horovod's
        rank-0 resume recipe, then a broadcast). A saved adaptation's rotation registers
        process sets, which is collective, so it is rebuilt at the next step's
        :meth:`group_at`, which every rank reaches together.
        """
        self.step = int(state["step"])
        self.swa_count = int(state.get("swa_count", 0))
        if state.get("adapted") and self.adaptation is not None:
            self._restored = state["adapted"]

    def _restore(self) -> None:
        """Rebuild the rotation :meth:`load_state` kept (collective)."""
        adapted, self._restored = self._restored, None
        self._swap(self.adaptation.restore(adapted, self.schedule))
        # The rotations rebuilt before the checkpoint; this run's probes count afresh.
        stats = self.stats
        stats.record_adaptation(stats.probes, stats.probe_seconds,
                                self.adaptation.adaptations)

    # --- adaptation (DSSync(probe_every=K)) ------------------------------------------

    def _adapt(self, step: int) -> None:
        """Probe at the probing steps (once per step) and swap in a rebuilt rotation."""
        if self._restored is not None:
            self._restore()
        if self.adaptation is None or self._probed_step == step:
            return
        self._probed_step = step
        new = self.adaptation.maybe_adapt(step, self.schedule)
        a = self.adaptation
        if new is not None:
            self._swap(new)
        self.stats.record_adaptation(a.probes, a.probe_seconds, a.adaptations,
                                     step if new is not None else None)

    def _swap(self, schedule) -> None:
        """Use ``schedule`` from now on; register its groups (collective, same order)."""
        self.schedule = schedule
        self._register([g for g in schedule.groups() if len(g) < self.size])

    @staticmethod
    def tensor_prefix(group: Sequence[int]) -> str:
        """The Horovod name of one group's allreduce (before the dtype), the same on
        every member."""
        return f"hvdx.dssync.{'-'.join(map(str, group))}"

    # --- registration -----------------------------------------------------------------

    def _ensure_sets(self, step: int):
        """Shuffle schedule: register the next LOOKAHEAD steps' groups when needed."""
        schedule = self.schedule
        if not isinstance(schedule, ShuffleSchedule):
            return
        needed = [g for g in schedule.partition(step) if 1 < len(g) < self.size]
        if all(g in self._sets for g in needed):
            return
        ahead = schedule.groups_used(range(step, step + LOOKAHEAD))
        self._register([g for g in ahead if len(g) < self.size])

    def _register(self, groups: Sequence[Tuple[int, ...]]):
        """Find or add a process set for every group, in the given order, on every rank.

        Every rank sees the same table of registered sets (registration is collective),
        so every rank adds the same sets in the same order, or raises the same error.
        """
        registered = registered_sets(self._hvd)
        missing = [g for g in groups if g not in self._sets and g not in registered]
        if missing and not dynamic_process_sets():
            framework = self._hvd.__name__.split(".")[-1]
            raise ValueError(
                f"DS-Sync needs Horovod process sets for its groups ({len(missing)} not "
                f"registered, e.g. {list(missing[0])}). Call "
                "hvd.init(process_sets=\"dynamic\"), or pass "
                f"process_sets=hvdx.{framework}.dssync_process_sets(sync, size) to "
                "hvd.init.")
        for g in groups:
            if g in self._sets:
                continue
            if g in registered:
                self._sets[g] = registered[g]
            else:
                self._sets[g] = self._hvd.add_process_set(list(g))


_EXIT_BARRIER: List[object] = []


def _barrier_at_exit(global_process_set) -> None:
    """Make every rank wait for the others before Horovod shuts down at exit.

    Groups finish their last average at different times, and a rank that exits shuts
    Horovod down under the ranks still averaging in other groups (their op fails with
    "Horovod has been shut down"). Registered after ``hvd.init`` (whose shutdown hook
    therefore runs later: atexit is last in, first out); an uncaught exception aborts
    the job through :mod:`hvdx.mpi.abort` before atexit, so this cannot hang it.
    """
    if not _EXIT_BARRIER:
        _EXIT_BARRIER.append(world(global_process_set))
        atexit.register(_EXIT_BARRIER[0].Barrier)


#: Seconds :func:`registered_sets` retries a table that reads as not initialized while
#: Horovod is.
TABLE_RETRY_S = 5.0


def registered_sets(horovod) -> Dict[Tuple[int, ...], object]:
    """Every process set Horovod holds now but its global set, by its ranks.

    Workaround: Horovod has no public lookup of registered sets, and
    ``add_process_set`` refuses a duplicate; this reads its own table through its C
    API (:func:`_read_table`). Horovod reads that table without its lock (its docstring
    warns of "spurious failures"), and a set its background thread is still setting up
    or tearing down reads as "Horovod has not been initialized properly": while
    ``hvd.is_initialized()`` holds, the read is tried again, for up to
    :data:`TABLE_RETRY_S` seconds. The global set is not read at all: after sets were
    added and removed, Horovod 0.28.1 was seen, on one rank of four in about one job in
    ten, to report its global set's ranks as "not initialized" for seconds while every
    op still ran (so its own ``_get_process_set_ids_and_ranks`` failed there).
    """
    began = time.monotonic()
    while True:
        try:
            table = _read_table(horovod)
            break
        except ValueError as error:
            initialized = horovod.is_initialized()
            waited = time.monotonic() - began
            if not initialized or waited > TABLE_RETRY_S:
                # What the table held, for the reader of a failure that cannot be
                # made on demand (Horovod's own message says only "not initialized").
                raise ValueError(f"{error} (hvdx read Horovod's process-set table for "
                                 f"{waited:.2f} s; hvd.is_initialized()={initialized}; "
                                 f"table: {_table_codes(horovod)})") from None
            time.sleep(0.01)
    out = {}
    for process_set_id, ranks in table.items():
        ps = horovod.ProcessSet(list(ranks))
        ps.process_set_id = process_set_id
        out[tuple(ranks)] = ps
    return out


def _read_table(horovod) -> Dict[int, List[int]]:
    """``{id: ranks}`` of every set in Horovod's table but the global set (id 0), read
    as Horovod's ``_get_process_set_ids_and_ranks`` reads it, through the same C
    functions; ``ValueError`` where Horovod's says "not initialized properly" of a set,
    or where the table changed during the read (both read again by the caller)."""
    import ctypes

    basics = horovod.mpi_ops._basics
    lib = basics.MPI_LIB_CTYPES
    count = int(lib.horovod_number_of_process_sets())
    ids = (ctypes.c_int * count)()
    lib.horovod_process_set_ids(ids)
    table = {}
    for process_set_id in ids:
        if process_set_id == 0:
            continue
        size = int(lib.horovod_process_set_size(ctypes.c_int(process_set_id)))
        ranks = (ctypes.c_int * max(size, 0))()
        read = int(lib.horovod_process_set_ranks(ctypes.c_int(process_set_id), ranks)) \
            if size >= 0 else size
        if basics.HOROVOD_PROCESS_SET_ERROR_INIT in (size, read):
            raise ValueError("Horovod has not been initialized properly; use hvd.init().")
        if size < 0 or read < 0:  # removed between the reads: read it all again
            raise ValueError(f"Horovod's process-set table changed while hvdx read it "
                             f"(set {process_set_id}: size {size}, ranks {read})")
        table[int(process_set_id)] = list(ranks)
    return table


def _table_codes(horovod) -> str:
    """Each id in Horovod's process-set table with the size and rank read its C API
    returns (negative: Horovod's error codes), or why they could not be read."""
    try:
        lib = horovod.mpi_ops._basics.MPI_LIB_CTYPES
        import ctypes

        count = int(lib.horovod_number_of_process_sets())
        ids = (ctypes.c_int * count)()
        lib.horovod_process_set_ids(ids)
        codes = []
        for i in ids:
            size = int(lib.horovod_process_set_size(ctypes.c_int(i)))
            ranks = (ctypes.c_int * max(size, 0))()
            read = int(lib.horovod_process_set_ranks(ctypes.c_int(i), ranks))
            codes.append(f"id {i}: size {size}, ranks read {read} {list(ranks)}")
        return "; ".join(codes) or "empty"
    except Exception as error:  # noqa: BLE001 (diagnostics only)
        return f"unreadable ({type(error).__name__}: {error})"


def dynamic_process_sets() -> bool:
    """Whether Horovod accepts ``add_process_set`` (``hvd.init(process_sets="dynamic")``)."""
    return os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS", "0").strip().lower() \
        not in ("", "0", "false", "no", "off")


def static_groups(sync: MixingStrategy, size: int) -> List[Tuple[int, ...]]:
    """The groups to register at ``hvd.init(process_sets=...)`` for static mode.

    Every group of two or more ranks, except the group of all ranks (Horovod's global
    set), in sorted order. A rotation without ``topology=`` detects it here from
    ``MPI.COMM_WORLD`` (collective).

    Raises:
        ValueError: for ``schedule="shuffle"``, whose groups are too many to register
            statically: use ``hvd.init(process_sets="dynamic")``; for an invalid
            ``sync`` (:func:`hvdx.strategy_contract.validating`). Raised on every rank, with the
            same message, after the ranks compared their arguments over
            ``MPI.COMM_WORLD`` (collective): ``hvd.init`` would hang otherwise.
    """
    problem = None
    # DS-Sync by its registry key, as the framework registries dispatch: the spec's
    # module imports this layer (its prepare runs collectives), not the other way.
    if not (isinstance(sync, Strategy) and sync.name == "dssync"):
        problem = ValueError(f"sync={sync!r} must be a hvdx.DSSync")
    elif sync.error is not None:
        problem = sync.error
    elif sync.kind == "shuffle":
        problem = ValueError("dssync_process_sets: schedule='shuffle' draws new groups "
                             "every step; call hvd.init(process_sets=\"dynamic\") instead")
    settings = [("sync", repr(sync)), ("size", size)]
    if problem is not None:
        settings.append(("dssync.error", str(problem)))
    check_consistent(Fingerprint.build(settings=settings), MPI.COMM_WORLD,
                     "dssync_process_sets")
    if problem is not None:
        raise problem
    topology = None
    if sync.needs_topology and sync.topology is None:
        from hvdx.mpi.topology import detect_topology
        topology = detect_topology()
    rates = link_rates_from_environment() if sync.needs_topology else None
    schedule = sync.build(size, topology, rates)
    return [tuple(g) for g in schedule.groups() if len(g) < size]
