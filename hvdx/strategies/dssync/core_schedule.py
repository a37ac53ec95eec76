"""DS-Sync schedules: which ranks average their models together at each step.

DS-Sync (Wang et al., "Divide-and-Shuffle Synchronization for Distributed Machine
Learning", arXiv 2007.03298) divides the ranks into non-overlapping groups that average
their parameters independently, and reshuffles the groups every iteration so information
reaches everyone. A schedule here is a pure function of ``(its settings, step)`` that
returns a partition (:data:`hvdx.core.topology.Partition`): every rank computes it
locally, with no communication, and gets the same answer.

Three schedules:

- :class:`RotationSchedule` (our design, exact consensus): mixed-radix rotation between
  intra-rack phases (no uplink traffic) and cross phases (one rank per rack per group);
  its defaults follow the cost of crossing (:func:`default_rotation_parameters`);
- :class:`ShuffleSchedule`: a fresh seeded random partition every step, as in the paper;
- :class:`ListSchedule`: a user-supplied list of partitions, cycled.

What the MPI / framework adapters must follow:

1. call ``partition(step)`` (or ``group(step, rank)``) with the optimizer's step count,
   the same on every rank; never the global RNG;
2. register communicators for :meth:`RotationSchedule.groups` /
   :meth:`ListSchedule.groups` once, in the listed order, on every rank (Horovod's
   ``add_process_set`` is collective); a group of all ranks is the global process set,
   a group of one rank needs no communication;
3. a :class:`ShuffleSchedule` has too many possible groups to register (``C(n, g)``):
   either register :meth:`ShuffleSchedule.groups_used` of the next ``K`` steps ahead
   (collectively, every ``K`` steps) or split an MPI communicator each step with the
   rank's group index as colour (every rank computes the same colours);
4. add ``settings()`` to the cross-rank fingerprint (:mod:`hvdx.core.fingerprint`), so a
   rank with another seed, schedule or topology stops the job instead of hanging.
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from hvdx.core.cost_model import parse_rate
from hvdx.core.sharding import shard_bounds
from hvdx.core.topology import Partition, Topology, canonical, digit_groups
from hvdx.core.validation import check_integer

__all__ = [
    "ListSchedule",
    "RotationSchedule",
    "ShuffleSchedule",
    "default_rotation_parameters",
    "validate_partition",
]

Setting = Tuple[str, object]


class _Schedule:
    """What every schedule offers: ``n``, ``partition(step)``, ``group``, ``settings``."""

    n: int

    def partition(self, step: int) -> Partition:
        raise NotImplementedError

    def group(self, step: int, rank: int) -> Tuple[int, ...]:
        """The group ``rank`` averages with at ``step`` (itself included)."""
        check_integer("rank", rank, 0, self.n - 1)
        return next(g for g in self.partition(step) if rank in g)

    def settings(self) -> List[Setting]:
        raise NotImplementedError


class _Cycle(_Schedule):
    """A schedule that repeats a fixed list of partitions."""

    _cycle: Tuple[Partition, ...]

    @property
    def period(self) -> int:
        """Number of steps after which the schedule repeats."""
        return len(self._cycle)

    def partition(self, step: int) -> Partition:
        return self._cycle[check_integer("step", step, 0) % self.period]

    def partitions(self) -> Tuple[Partition, ...]:
        """The distinct partitions of one period, in order of first use."""
        return tuple(dict.fromkeys(self._cycle))

    def groups(self) -> Tuple[Tuple[int, ...], ...]:
        """Every group of two or more ranks the schedule ever uses, sorted.

        The finite set of communicators (Horovod process sets) to register once.
        """
        return tuple(sorted({g for p in self._cycle for g in p if len(g) > 1}))


class RotationSchedule(_Cycle):
    """Mixed-radix rotation: intra-rack phases, then one cross-rack phase, repeated.

    Rank coordinates ``(local, host, rack)`` (:meth:`Topology.coordinates`) are digits
    of a mixed-radix number; averaging over the ranks that differ only in one digit, for
    every digit once, leaves every rank with the global mean (the averaging operators of
    different digits commute and their product is the global mean). The cycle is:

    1. ``intra_phases`` intra-rack phases. By default each averages a whole rack (the
       ``local`` and ``host`` digits together: a ring over a rack leaves each host once,
       so it puts fewer bytes on each NIC than a host-digit phase). With
       ``split_hosts=True`` they cycle through the ``local`` digit (ranks of one host)
       and the ``host`` digit (one rank per host of a rack), as in the reference design;
    2. one cross phase (the ``rack`` digit): the ranks with place ``p`` in every rack
       (:meth:`Topology.positions_in_rack`) form one group, for ``p < cross_ranks``;
       the other ranks are singletons that step (skip communication), so the cross phase
       loads the uplink and only the crossing ranks' NICs, as :mod:`hvdx.core.cost_model`
       prices it. The same places cross every time, so the process sets stay few;
    3. repeat until every intra digit has been used as often as any other: ``period`` is
       ``blocks * (intra_phases + 1)``, ``blocks = m / gcd(intra_phases, m)`` for ``m``
       intra digits.

    With ``cross_ranks`` all (the default) on a regular topology, any ``period``
    consecutive phases of pure averaging leave every rank with the global mean. With
    fewer crossing ranks, or on an irregular topology, averaging still preserves the
    global mean and contracts towards it, but not exactly in one period.

    Degenerate topologies: with one rack every phase is intra-rack; with one rank per
    rack every phase crosses; ``intra_phases`` is then unused.

    Args:
        topology: the ranks' hosts and racks.
        intra_phases: intra-rack phases per cross phase, at least 1.
        cross_ranks: ranks per rack in a cross phase, 1 to the largest rack's size;
            ``None``: all of them (see :func:`default_rotation_parameters`).
        split_hosts: split each intra-rack phase into host digits (see step 1).
        places: every rank's place in its rack (each rack's places are ``0..w-1``),
            which decides who crosses in step 2; ``None``:
            :meth:`Topology.positions_in_rack`. The bandwidth probe passes an order
            that puts ranks with a slow way out of their rack last
            (:func:`hvdx.core.bandwidth.cross_places`).
    """

    def __init__(self, topology: Topology, intra_phases: int = 1,
                 cross_ranks: Optional[int] = None, split_hosts: bool = False,
                 places: Optional[Sequence[int]] = None):
        if not isinstance(topology, Topology):
            raise ValueError(f"topology={topology!r} must be a hvdx.core.topology.Topology")
        width = max(len(g) for g in topology.rack_groups())
        self.topology = topology
        self.n = topology.size
        self.intra_phases = check_integer("intra_phases", intra_phases, 1)
        self.cross_ranks = width if cross_ranks is None else \
            check_integer("cross_ranks", cross_ranks, 1, width)
        self.split_hosts = bool(split_hosts)
        self.places = topology.positions_in_rack() if places is None else \
            _validate_places(topology, places)
        self._cycle, self._kinds = self._build()

    def _build(self) -> Tuple[Tuple[Partition, ...], Tuple[str, ...]]:
        t = self.topology
        digits = [digit_groups(t, d) for d in ("local", "host")] if self.split_hosts \
            else [t.rack_groups()]
        intra = [p for p in digits if any(len(g) > 1 for g in p)]
        cross = None
        if t.n_racks > 1:
            places = self.places
            cross = canonical([[r for r in range(self.n) if places[r] == p]
                               for p in range(self.cross_ranks)] +
                              [[r] for r in range(self.n) if places[r] >= self.cross_ranks])
        if cross is None:
            return (tuple(intra) or (canonical([[r] for r in range(self.n)]),),
                    ("intra",) * max(len(intra), 1))
        if not intra:
            return (cross,), ("cross",)
        blocks = len(intra) // math.gcd(self.intra_phases, len(intra))
        cycle, kinds = [], []
        for b in range(blocks):
            for i in range(self.intra_phases):
                cycle.append(intra[(b * self.intra_phases + i) % len(intra)])
                kinds.append("intra")
            cycle.append(cross)
            kinds.append("cross")
        return tuple(cycle), tuple(kinds)

    def phase_kind(self, step: int) -> str:
        """``"intra"`` (no group spans racks) or ``"cross"`` (at most one rank per rack)."""
        return self._kinds[check_integer("step", step, 0) % self.period]

    def settings(self) -> List[Setting]:
        return [("dssync.schedule", "rotation"), ("dssync.topology", self.topology.digest()),
                ("dssync.intra_phases", self.intra_phases),
                ("dssync.cross_ranks", self.cross_ranks),
                ("dssync.split_hosts", self.split_hosts)] + \
            ([] if self.places == self.topology.positions_in_rack()
             else [("dssync.places", self.places)])

    def __repr__(self) -> str:
        return (f"RotationSchedule(n={self.n}, intra_phases={self.intra_phases}, "
                f"cross_ranks={self.cross_ranks}, split_hosts={self.split_hosts})")


class ShuffleSchedule(_Schedule):
    """A seeded random partition into groups of at most ``group_size``, new every step.

    1. step ``t`` draws ``n`` raw 64-bit words from
       ``PCG64(SeedSequence(seed, spawn_key=(t,)))`` and orders the ranks by them (a
       stable argsort): any step is computed directly, on any rank, in any order, with
       the same result. Only the seed sequence and the raw bit stream are used, which
       NumPy keeps identical across versions (``Generator.permutation`` is not promised
       to be), so ranks with different NumPy versions still agree;
    2. a random permutation of the ranks is cut into ``ceil(n / group_size)`` groups
       whose sizes differ by at most one (:func:`hvdx.core.sharding.shard_bounds`), so
       no rank is left alone when ``n % group_size == 1`` (e.g. ``n = 7, g = 3``: 3, 2, 2).

    There is no finite period: see the module docstring, step 3, for communicators.
    """

    def __init__(self, n: int, group_size: int, seed: int = 0):
        self.n = check_integer("n", n, 1)
        self.group_size = check_integer("group_size", group_size, 1, self.n)
        self.seed = check_integer("seed", seed, 0)

    def partition(self, step: int) -> Partition:
        step = check_integer("step", step, 0)
        bits = np.random.PCG64(np.random.SeedSequence(self.seed, spawn_key=(step,)))
        order = np.argsort(bits.random_raw(self.n), kind="stable")
        bounds = shard_bounds(self.n, -(-self.n // self.group_size))
        return canonical(order[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:]))

    def groups_used(self, steps: Iterable[int]) -> Tuple[Tuple[int, ...], ...]:
        """Every group of two or more ranks used at ``steps``, sorted (to pre-register)."""
        return tuple(sorted({g for s in steps for g in self.partition(s) if len(g) > 1}))

    def settings(self) -> List[Setting]:
        return [("dssync.schedule", "shuffle"), ("dssync.n", self.n),
                ("dssync.group_size", self.group_size), ("dssync.seed", self.seed)]

    def __repr__(self) -> str:
        return f"ShuffleSchedule(n={self.n}, group_size={self.group_size}, seed={self.seed})"


class ListSchedule(_Cycle):
    """User-supplied partitions, used in turn: step ``t`` uses ``partitions[t % len]``.

    Args:
        partitions: a non-empty sequence of partitions of ``range(n)``; each is
            validated (:func:`validate_partition`) and stored in canonical order.
        n: number of ranks; ``None``: the number of ranks in the first partition.
    """

    def __init__(self, partitions: Sequence, n: Optional[int] = None):
        partitions = list(partitions)
        if not partitions:
            raise ValueError("partitions=[] must hold at least one partition")
        if n is None:
            try:
                n = sum(len(g) for g in partitions[0])
            except TypeError:
                raise ValueError(f"partitions[0]={partitions[0]!r} must be a sequence of "
                                 "groups of ranks") from None
        self.n = check_integer("n", n, 1)
        self._cycle = tuple(validate_partition(p, self.n, name=f"partitions[{i}]")
                            for i, p in enumerate(partitions))

    def settings(self) -> List[Setting]:
        return [("dssync.schedule", "list"), ("dssync.n", self.n),
                ("dssync.partitions", repr(self._cycle))]

    def __repr__(self) -> str:
        return f"ListSchedule(n={self.n}, period={self.period})"


def _validate_places(topology: Topology, places: Sequence[int]) -> Tuple[int, ...]:
    """``places`` as a tuple; ValueError unless each rack's places are ``0..w-1``."""
    try:
        places = tuple(places)
    except TypeError:
        raise ValueError(f"places={places!r} must give every rank its place in its rack") \
            from None
    if len(places) != topology.size:
        raise ValueError(f"places has {len(places)} entries but the topology has "
                         f"{topology.size} ranks")
    for rack, ranks in enumerate(topology.rack_groups()):
        got = sorted(places[r] for r in ranks)
        if got != list(range(len(ranks))):
            raise ValueError(f"places: rack {rack} (ranks {list(ranks)}) has places {got}; "
                             f"they must be 0 to {len(ranks) - 1}, each once")
    return tuple(int(p) for p in places)


def validate_partition(partition, n: int, name: str = "partition") -> Partition:
    """Checks that ``partition`` splits ``range(n)`` into non-empty disjoint groups.

    Returns:
        The partition in canonical order.

    Raises:
        ValueError: naming ``name`` and what is wrong: an empty group, a value that is
            not a rank, a rank outside ``0..n-1``, a rank in two groups, a missing rank.
    """
    n = check_integer("n", n, 1)
    try:
        groups = [list(g) for g in partition]
    except TypeError:
        raise ValueError(f"{name}={partition!r} must be a sequence of groups of ranks") \
            from None
    seen: Dict[int, int] = {}
    for i, group in enumerate(groups):
        if not group:
            raise ValueError(f"{name}: group {i} is empty")
        for rank in group:
            if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
                raise ValueError(f"{name}: group {i} holds {rank!r}, which is not a rank")
            if not 0 <= rank < n:
                raise ValueError(f"{name}: rank {rank} in group {i} is outside 0..{n - 1}")
            if rank in seen:
                raise ValueError(f"{name}: overlapping rank {rank} is in groups "
                                 f"{seen[rank]} and {i}")
            seen[int(rank)] = i
    missing = [r for r in range(n) if r not in seen]
    if missing:
        raise ValueError(f"{name}: missing rank {missing[0]} is in no group"
                         + (f" ({len(missing)} ranks missing)" if len(missing) > 1 else ""))
    return canonical(groups)


def default_rotation_parameters(topology: Topology, nic_bps, uplink_bps,
                                max_intra_phases: int = 16) -> Tuple[int, int]:
    """``(intra_phases, cross_ranks)`` for :class:`RotationSchedule`, from link rates.

    In model copies ``M`` (``W`` ranks in the largest rack, ``R`` racks, ``H`` hosts in
    the largest rack, ``n`` ranks; the cost model of :mod:`hvdx.core.cost_model`):

    1. ``cross_ranks = clamp(floor(uplink / nic), 1, W)``: as many crossing rings as the
       uplink carries at NIC speed (an oversubscribed uplink: one). With 2 racks x 2
       hosts, a cross phase where both pairs cross puts 2 M on the uplink each way
       where a ring allreduce over all ranks puts 1.5 M;
    2. the cross phase takes ``T_cross = 2(R-1)/R / min(nic / ceil(c/H), uplink / c)``
       and an intra-rack phase ``T_intra = 2(W-1)/W / nic``; ``intra_phases`` is the
       smallest ``k >= 1`` with ``T_cross <= k * T_intra`` (the slow link is busy at most
       as long as the intra-rack phases between two crossings), capped at
       ``max_intra_phases`` so racks still mix;
    3. raised if needed so the uplink carries on average at most what a ring over all
       ranks would: ``c * 2(R-1)/R / (k+1) <= 2(n-1)/n`` per step each way.

    Args:
        topology: the ranks' hosts and racks.
        nic_bps: a host NIC's rate each way (bits/s or a tc string like ``"25gbit"``).
        uplink_bps: a rack uplink's rate each way.
        max_intra_phases: the cap of step 2.
    """
    nic, uplink = parse_rate(nic_bps, "nic_bps"), parse_rate(uplink_bps, "uplink_bps")
    cap = check_integer("max_intra_phases", max_intra_phases, 1)
    racks = topology.rack_groups()
    n, r = topology.size, len(racks)
    w = max(len(g) for g in racks)
    h = max(len({topology.hosts[x] for x in g}) for g in racks)
    if r == 1 or w == 1:
        return 1, w
    c = min(max(int(uplink // nic), 1), w)
    t_intra = 2 * (w - 1) / w / nic
    t_cross = 2 * (r - 1) / r / min(nic / math.ceil(c / h), uplink / c)
    k_time = min(max(math.ceil(t_cross / t_intra - 1e-12), 1), cap)
    k_bytes = max(math.ceil(c * (r - 1) / r * n / (n - 1) - 1 - 1e-12), 1)
    return max(k_time, k_bytes), c


