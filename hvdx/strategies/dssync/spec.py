"""``hvdx.DSSync``: the framework-neutral description of a DS-Sync run.

DS-Sync (Wang et al., "Divide-and-Shuffle Synchronization for Distributed Machine
Learning", arXiv 2007.03298) replaces the gradient allreduce: every rank takes a local
optimizer step, then averages its parameters inside its group of the step's partition.
This module only holds and validates the user's choices; the schedules are in
:mod:`hvdx.strategies.dssync.core_schedule`, the framework adapters build them with
:meth:`DSSync.build` once the number of ranks (and, for the rotation, the topology) is
known:

1. ``DSSync(...)`` checks every argument that does not depend on the job
   (``ValueError`` naming the argument);
2. the adapter calls :meth:`DSSync.build` with the job's size and topology, which checks
   the rest (``group_size`` at most the number of ranks, partitions of the right ranks);
3. the adapter adds :meth:`DSSync.settings` to the cross-rank fingerprint, so a rank with
   another seed, schedule or topology stops the job with the same error on every rank.

Example::

    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   sync=hvdx.DSSync("shuffle", group_size=4, seed=1))
"""

from __future__ import annotations

from typing import Callable, List, NamedTuple, Optional, Tuple

from hvdx.core.bandwidth import DEFAULT_PROBE_BYTES
from hvdx.core.topology import Topology
from hvdx.core.validation import check_integer
from hvdx.strategies.dssync.core_link_rates import (LINK_RATES_VARIABLES,
                                                    link_rates_from_environment, parse_link_rates)
from hvdx.strategies.dssync.core_schedule import (ListSchedule, RotationSchedule, ShuffleSchedule,
                                                  default_rotation_parameters)
from hvdx.strategy_contract import Job, MixingStrategy, validating

__all__ = ["DSSync", "DSSyncSetup", "LINK_RATES_VARIABLES", "link_rates_from_environment",
           "parse_link_rates"]

SCHEDULES = ("rotation", "shuffle")


class DSSyncSetup(NamedTuple):
    """What :meth:`DSSync.prepare` found for the job: the schedule and its inputs."""

    schedule: object
    topology: Optional[Topology]
    link_rates: Optional[Tuple[int, int]]


class DSSync(MixingStrategy):
    """Divide-and-shuffle synchronization: local steps, then averaging inside groups.

    Args:
        schedule: ``"rotation"`` (mixed-radix rotation over the topology's racks,
            exact consensus: :class:`~hvdx.strategies.dssync.core_schedule.RotationSchedule`),
            ``"shuffle"`` (a fresh seeded random partition every step, as in the paper)
            or a list of partitions of the ranks, used in turn.
        group_size: ``"shuffle"`` only (required there): ranks per group, at most the
            number of ranks. ``1`` is local SGD; the number of ranks is one group of all.
        seed: ``"shuffle"``: the seed every rank draws the partitions from.
        intra_phases: ``"rotation"``: intra-rack phases per cross-rack phase. Default:
            from the cost of crossing when the link rates are known (``link_rates``),
            else 1.
        cross_ranks: ``"rotation"``: ranks per rack that cross. Default: from the cost
            of crossing when the link rates are known, else all.
        link_rates: ``"rotation"``: ``(nic, uplink)``, a host's NIC rate and a rack
            uplink's rate each way (bits/s or tc strings such as ``"25gbit"``). With
            ``intra_phases`` and ``cross_ranks`` both left ``None``, they come from
            :func:`~hvdx.strategies.dssync.core_schedule.default_rotation_parameters` of these
            rates: on an oversubscribed uplink, one rank per rack crosses, and as many intra-rack
            phases run between crossings as the slow uplink needs to carry one. ``None``:
            read ``HVDX_LINK_RATES`` (``"nic,uplink"``), else
            ``HVDX_CLUSTER_LINK_RATES`` (set by the emulated cluster), if set;
            ``hvdx topology --probe`` measures and prints them.
        topology: ``"rotation"``: a :class:`~hvdx.core.topology.Topology`; ``None``:
            detected from MPI (:func:`hvdx.mpi.topology.detect_topology`).
        average_optimizer_state: also average the optimizer's per-parameter tensors
            (momentum buffers, Adam moments) inside each group.
        global_every: every ``global_every``-th step averages over all ranks instead;
            ``0``: never.
        swa_start: the final SWA-style merge (the paper's last stage, after Izmailov et
            al., "Averaging Weights Leads to Wider Optima", arXiv 1803.05407): from the
            step of this index on (0-based), every rank keeps a running average of its
            parameters after the group averaging, sampled every ``swa_every`` steps;
            ``synchronize_parameters(swa=True)`` then writes the mean over all ranks of
            those averages into the parameters. ``None``: no running average.
        swa_every: steps between two samples of the running average (``swa_start``
            must be set).
        probe_every: ``"rotation"`` only: every ``probe_every`` steps, rerun the
            bandwidth probe (:mod:`hvdx.mpi.probe`, collective, the same steps on every
            rank) and, if the measured racks or slow links call for other groups,
            rebuild the rotation from them (:mod:`hvdx.strategies.dssync.mpi_adapt`); ``0``: never.
            A rebuilt rotation may need new groups: use
            ``hvd.init(process_sets="dynamic")``.
        probe_bytes: bytes per probe transfer (default 4 MiB).
        probe: ``None`` (measure), or a callable ``step -> n x n`` matrix of rates
            from row to column (e.g. from a monitoring system), called on rank 0 and
            broadcast, instead of the probe's transfers.
    """

    @validating
    def __init__(self, schedule="rotation", group_size: Optional[int] = None,
                 seed: int = 0, intra_phases: Optional[int] = None,
                 cross_ranks: Optional[int] = None, topology: Optional[Topology] = None,
                 average_optimizer_state: bool = False, global_every: int = 0,
                 swa_start: Optional[int] = None, swa_every: int = 1,
                 probe_every: int = 0, probe_bytes: int = DEFAULT_PROBE_BYTES,
                 probe: Optional[Callable] = None,
                 link_rates: Optional[Tuple[object, object]] = None):
        self.partitions: Optional[ListSchedule] = None
        if isinstance(schedule, str):
            if schedule not in SCHEDULES:
                raise ValueError(f"schedule={schedule!r} must be 'rotation', 'shuffle' "
                                 "or a list of partitions")
            self.kind = schedule
        else:
            try:
                partitions = list(schedule)
            except TypeError:
                raise ValueError(f"schedule={schedule!r} must be 'rotation', 'shuffle' "
                                 "or a list of partitions") from None
            # Validates every partition: disjoint, non-empty groups covering 0..n-1.
            self.partitions = ListSchedule(partitions)
            self.kind = "list"
        self.group_size = _optional_integer("group_size", group_size, 1)
        if self.kind == "shuffle" and self.group_size is None:
            raise ValueError("group_size=None: schedule='shuffle' needs group_size, the "
                             "number of ranks per group")
        if self.kind != "shuffle" and self.group_size is not None:
            raise ValueError(f"group_size={group_size!r} applies to schedule='shuffle' "
                             "only; the rotation's groups follow the topology, a list's "
                             "groups are given")
        self.seed = check_integer("seed", seed, 0)
        self.intra_phases = _optional_integer("intra_phases", intra_phases, 1)
        self.cross_ranks = _optional_integer("cross_ranks", cross_ranks, 1)
        if topology is not None and not isinstance(topology, Topology):
            raise ValueError(f"topology={topology!r} must be a hvdx.core.topology.Topology "
                             "or None (detect)")
        self.topology = topology
        self.link_rates = None if link_rates is None else \
            parse_link_rates(link_rates, "link_rates")
        for name, value in (("intra_phases", intra_phases), ("cross_ranks", cross_ranks),
                            ("topology", topology), ("link_rates", link_rates)):
            if value is not None and self.kind != "rotation":
                raise ValueError(f"{name}={value!r} applies to schedule='rotation' only")
        self._init_mixing(global_every=global_every, swa_start=swa_start,
                          swa_every=swa_every,
                          average_optimizer_state=average_optimizer_state)
        self.probe_every = check_integer("probe_every", probe_every, 0)
        if self.probe_every and self.kind != "rotation":
            raise ValueError(f"probe_every={probe_every!r} applies to schedule='rotation' "
                             "only: the other schedules do not follow the topology")
        self.probe_bytes = check_integer("probe_bytes", probe_bytes, 1)
        if probe is not None and not callable(probe):
            raise ValueError(f"probe={probe!r} must be None (measure) or a callable "
                             "step -> bandwidth matrix")
        self.probe = probe

    name = "dssync"
    state_key = "hvdx_dssync"

    # --- the strategy contract (hvdx.strategy_contract) ---------------------------------------

    def prepare(self, job: Job) -> DSSyncSetup:
        """Detect the topology if the rotation needs it (collective over all ranks),
        check the other arguments, and build the schedule for the job."""
        topology = None
        if self.needs_topology and self.topology is None:
            from hvdx.mpi.comm import world
            from hvdx.mpi.topology import detect_topology
            topology = detect_topology(world(job.global_process_set))
        self.check_gradient_arguments(job, "DS-Sync")
        rates = link_rates_from_environment() if self.needs_topology else None
        return DSSyncSetup(self.build(job.size, topology, rates), topology, rates)

    def fingerprint_settings(self, job: Job, setup: DSSyncSetup) -> List[Tuple[str, object]]:
        return self.settings(job.size, setup.topology, setup.link_rates)

    def make_mixer(self, setup: DSSyncSetup):
        """DS-Sync's mixer (:class:`hvdx.strategies.dssync.mixer.GroupMixer`)."""
        from hvdx.strategies.dssync.mixer import GroupMixer

        return GroupMixer(self, setup.schedule)

    @property
    def needs_topology(self) -> bool:
        """Whether :meth:`build` needs a topology (the rotation does)."""
        return self.kind == "rotation"

    def build(self, n: int, topology: Optional[Topology] = None,
              link_rates: Optional[Tuple[int, int]] = None):
        """The schedule for ``n`` ranks (a :mod:`hvdx.strategies.dssync.core_schedule` object).

        Args:
            n: number of ranks.
            topology: the detected topology, used when none was given at construction
                (required then for ``"rotation"``).
            link_rates: ``(nic, uplink)`` in bits/s found by the adapter
                (``HVDX_LINK_RATES``), used when none were given at construction.

        Raises:
            ValueError: ``group_size`` above ``n``, partitions of another number of
                ranks, or a topology of another size.
        """
        n = check_integer("n", n, 1)
        if self.kind == "shuffle":
            if self.group_size > n:
                raise ValueError(f"group_size={self.group_size} must be an integer from 1 "
                                 f"to the number of ranks, {n}")
            return ShuffleSchedule(n, self.group_size, self.seed)
        if self.kind == "list":
            if self.partitions.n != n:
                raise ValueError(f"schedule: the partitions cover {self.partitions.n} "
                                 f"ranks but the job has {n}")
            return self.partitions
        topology = self.topology if self.topology is not None else topology
        if topology is None:
            raise ValueError("topology=None: schedule='rotation' needs the ranks' hosts "
                             "and racks; pass topology= or let the adapter detect it")
        if topology.size != n:
            raise ValueError(f"topology has {topology.size} ranks but the job has {n}")
        intra_phases, cross_ranks = self.rotation_parameters(topology, link_rates)
        return RotationSchedule(topology, intra_phases=intra_phases, cross_ranks=cross_ranks)

    def rotation_parameters(self, topology: Topology,
                            link_rates: Optional[Tuple[int, int]] = None
                            ) -> Tuple[int, Optional[int]]:
        """``(intra_phases, cross_ranks)`` of the rotation: as given, else from the rates.

        Only when both are left ``None`` and rates are known (``link_rates=`` at
        construction, else the adapter's) does the cost model choose them; otherwise
        ``intra_phases`` defaults to 1 and ``cross_ranks`` to all ranks of a rack.
        """
        rates = self.link_rates if self.link_rates is not None else link_rates
        if self.intra_phases is None and self.cross_ranks is None and rates is not None:
            return default_rotation_parameters(topology, *rates)
        return self.intra_phases or 1, self.cross_ranks

    def settings(self, n: Optional[int] = None, topology: Optional[Topology] = None,
                 link_rates: Optional[Tuple[int, int]] = None) -> List[Tuple[str, object]]:
        """Fingerprint entries: the built schedule's settings, then the other arguments.

        With ``n``, the schedule is built (:meth:`build`) and its settings (for the
        rotation: the topology's digest) come first; without, only the arguments.
        """
        entries = list(self.build(n, topology, link_rates).settings()) if n is not None else \
            [("dssync.schedule", self.kind)]
        extra = [("dssync.group_size", self.group_size), ("dssync.seed", self.seed),
                 ("dssync.intra_phases", self.intra_phases),
                 ("dssync.cross_ranks", self.cross_ranks),
                 ("dssync.link_rates", self.link_rates if self.link_rates is not None
                  else link_rates),
                 ("dssync.topology", None if self.topology is None else self.topology.digest()),
                 ("dssync.partitions", None if self.partitions is None
                  else repr(self.partitions.partitions())),
                 ("dssync.average_optimizer_state", self.average_optimizer_state),
                 ("dssync.global_every", self.global_every),
                 ("dssync.swa_start", self.swa_start), ("dssync.swa_every", self.swa_every),
                 # Every rank must probe at the same steps, or the probe's transfers hang.
                 ("dssync.probe_every", self.probe_every),
                 ("dssync.probe_bytes", self.probe_bytes),
                 ("dssync.probe", None if self.probe is None else "callable")]
        seen = {name for name, _ in entries}
        return entries + [(name, value) for name, value in extra if name not in seen]

    def __repr__(self) -> str:
        if self.error is not None:
            return self.invalid_repr()
        schedule = repr(self.kind) if self.partitions is None else \
            f"<{self.partitions.period} partitions>"
        return (f"DSSync(schedule={schedule}, group_size={self.group_size}, "
                f"seed={self.seed}, intra_phases={self.intra_phases}, "
                f"cross_ranks={self.cross_ranks}, average_optimizer_state="
                f"{self.average_optimizer_state}, global_every={self.global_every}, "
                f"swa_start={self.swa_start}, swa_every={self.swa_every}, "
                f"probe_every={self.probe_every})")


def _optional_integer(name: str, value: object, low: int) -> Optional[int]:
    return None if value is None else check_integer(name, value, low)
