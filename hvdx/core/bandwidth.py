"""From a measured rank-to-rank bandwidth matrix to racks, slow links and crossing ranks.

DS-Sync (Wang et al., "Divide-and-Shuffle Synchronization for Distributed Machine
Learning", arXiv 2007.03298) places its groups so that little traffic crosses the
network's bottleneck. When the racks are not labelled, or a link slows down during
training, the bottleneck has to be measured. This module is the pure half of that
measurement (the MPI half is :mod:`hvdx.mpi.probe`):

1. :func:`pair_rounds` schedules the transfers: every pair of ranks exactly once, in
   rounds of disjoint pairs (the circle method of round-robin tournaments), so all
   ``n (n - 1) / 2`` pairs take ``n - 1`` rounds (``n`` for odd ``n``);
2. the probe fills ``matrix[i, j]`` with the rate from ``i`` to ``j`` (NaN for pairs on
   one host, which share memory and are not measured) and gives every rank the same
   matrix; :func:`fill_same_host` makes those pairs as fast as the fastest link;
3. :func:`measured_topology` derives the racks (connected components of the fast links,
   :func:`hvdx.core.topology.groups_from_bandwidth`, unless labels are given), the slow
   links (:func:`hvdx.core.topology.slow_links`), and each rank's place in its rack
   (:func:`cross_places`: a rank whose way out of its rack is slow crosses last);
4. :func:`adapted_rotation` builds the rotation that measurement calls for and, with
   :func:`rotation_changed`, says whether it differs from the running one; since it
   reads only the shared matrix, every rank takes the same decision at the same step.
   It switches only when the running rotation hurts (hysteresis): with the racks
   unchanged, a new rotation is taken only if a rank that crosses now has a slow way
   out. A link that recovers, or noise that makes another rank look a little faster,
   changes nothing, so the rotation does not flap between probes.

Every function is deterministic in its inputs and uses no randomness.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, List, Optional, Sequence, Tuple

import numpy as np

from hvdx.core.topology import Partition, Topology, groups_from_bandwidth, slow_links
from hvdx.core.validation import check_integer
from hvdx.strategies.dssync.core_schedule import RotationSchedule

__all__ = [
    "DEFAULT_PROBE_BYTES",
    "MeasuredTopology",
    "adapted_rotation",
    "THRESHOLD_RATIO",
    "cross_places",
    "fill_same_host",
    "measured_topology",
    "pair_rounds",
    "rotation_changed",
    "rotation_on",
    "slow_ways_out",
]

#: Bytes per probe transfer: a few MB, so that a 1gbit link's 4 ms token bucket (in
#: the emulated cluster) and the start of a TCP stream are a small part of the time.
DEFAULT_PROBE_BYTES = 4 * 2**20

#: A link is slow below this fraction of the fastest one (and a rank's way out of its
#: rack below this fraction of its rack's best): far enough from 1 that measurement
#: noise (tens of percent on a shared machine) does not flip the answer.
THRESHOLD_RATIO = 0.5


def pair_rounds(n: int) -> Tuple[Tuple[Tuple[int, int], ...], ...]:
    """Rounds of disjoint pairs ``(i, j)``, ``i < j``, covering every pair exactly once.

    Circle method: rank ``n - 1`` (or a bye, for odd ``n``) stays put while the others
    turn one place per round; in round ``r`` rank ``(r + k) % m`` meets
    ``(r - k) % m``, ``m = n - 1`` (odd ``n``: ``m = n``, and the rank left over sits out).
    """
    n = check_integer("n", n, 1)
    m = n - 1 if n % 2 == 0 else n
    rounds = []
    for r in range(m):
        pairs = []
        for k in range(1, (m + 1) // 2 + (0 if m % 2 else 1)):
            a, b = (r + k) % m, (r - k) % m
            if a != b:
                pairs.append((min(a, b), max(a, b)))
        if n % 2 == 0:
            pairs.append((r, n - 1))
        if pairs:
            rounds.append(tuple(sorted(set(pairs))))
    return tuple(rounds)


def fill_same_host(matrix, hosts: Sequence[Hashable]) -> np.ndarray:
    """The matrix with the unmeasured pairs of one host set to the fastest link.

    Ranks of one host talk through shared memory: whatever the probe would measure,
    they belong to one rack and never form a slow link.

    Args:
        matrix: ``n x n`` rates; same-host entries may be NaN.
        hosts: one host label per rank.
    """
    m = np.array(matrix, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] != len(hosts):
        raise ValueError(f"matrix has shape {m.shape}; it must be square, one row per rank "
                         f"of the {len(hosts)} hosts entries")
    same = np.equal.outer(np.asarray(_labels(hosts)), np.asarray(_labels(hosts)))
    np.fill_diagonal(same, False)
    other = ~same & ~np.eye(len(hosts), dtype=bool)
    measured = m[other]
    if not np.all(np.isfinite(measured)):
        raise ValueError("matrix: every pair on different hosts needs a finite rate "
                         "(NaN is allowed for ranks of one host only)")
    fastest = measured.max() if measured.size else 1.0
    m[same] = fastest
    np.fill_diagonal(m, 0.0)
    return m


@dataclass(frozen=True)
class MeasuredTopology:
    """What a bandwidth matrix says about the job.

    Attributes:
        topology: hosts (as given) and racks (given, or the fast groups).
        places: every rank's place in its rack; the first ``cross_ranks`` places cross.
        slow_links: pairs ``(i, j)``, ``i < j``, below ``THRESHOLD_RATIO`` of the fastest.
        slow_out: per rank, whether its way out of its rack is slow
            (:func:`slow_ways_out`); all ``False`` when nothing was measured.
    """

    topology: Topology
    places: Tuple[int, ...]
    slow_links: Tuple[Tuple[int, int], ...]
    slow_out: Tuple[bool, ...] = ()

    def crossing(self, cross_ranks: int = 1) -> Partition:
        """The ranks of each rack that cross first (places below ``cross_ranks``)."""
        return tuple(tuple(r for r in g if self.places[r] < cross_ranks)
                     for g in self.topology.rack_groups())


def measured_topology(matrix, hosts: Sequence[Hashable],
                      racks: Optional[Sequence[Hashable]] = None,
                      threshold_ratio: float = THRESHOLD_RATIO) -> MeasuredTopology:
    """Racks, slow links and crossing order from a bandwidth matrix (module steps 2-3).

    Args:
        matrix: ``n x n`` rates from row to column, NaN allowed between ranks of one
            host (see :func:`fill_same_host`).
        hosts: one host label per rank (e.g. from an MPI shared-memory split).
        racks: one rack label per rank to keep (labelled racks are trusted over the
            probe: a host whose NIC is slowed would otherwise look like a rack of its
            own); ``None``: the racks are the fast groups, one host never split.
        threshold_ratio: in ``(0, 1]``, see :data:`THRESHOLD_RATIO`.
    """
    filled = fill_same_host(matrix, hosts)
    if racks is None:
        groups = groups_from_bandwidth(filled, threshold_ratio)
        racks = [next(i for i, g in enumerate(groups) if r in g) for r in range(len(hosts))]
    topology = Topology.from_ranks(list(hosts), list(racks))
    return MeasuredTopology(topology, cross_places(topology, filled, threshold_ratio),
                            slow_links(filled, threshold_ratio),
                            slow_ways_out(topology, filled, threshold_ratio))


def slow_ways_out(topology: Topology, matrix,
                  threshold_ratio: float = THRESHOLD_RATIO) -> Tuple[bool, ...]:
    """Per rank, whether its way out of its rack is slow (all ``False`` with one rack).

    1. a rank's way out is the median of its links (slower direction) to the ranks of
       the other racks;
    2. it is slow if below ``threshold_ratio`` times the best way out in its rack.
    """
    m = np.asarray(matrix, dtype=np.float64)
    if m.shape != (topology.size, topology.size) or not np.all(np.isfinite(m)):
        raise ValueError(f"matrix has shape {m.shape}; it must be {topology.size} x "
                         f"{topology.size} and finite (fill same-host pairs first)")
    if topology.n_racks < 2:
        return (False,) * topology.size
    links = np.minimum(m, m.T)
    racks = np.asarray(topology.racks)
    way_out = np.array([np.median(links[r, racks != racks[r]]) for r in range(topology.size)])
    slow = [False] * topology.size
    for group in topology.rack_groups():
        best = max(way_out[r] for r in group)
        for r in group:
            slow[r] = bool(way_out[r] < threshold_ratio * best)
    return tuple(slow)


def cross_places(topology: Topology, matrix,
                 threshold_ratio: float = THRESHOLD_RATIO) -> Tuple[int, ...]:
    """Every rank's place in its rack, ranks with a slow way out of the rack last.

    A rack orders its ranks by (slow, :meth:`Topology.positions_in_rack`), slow as in
    :func:`slow_ways_out`, so with nothing slow the places are the topology's own, and
    noise below the threshold changes nothing. With one rack nobody crosses and the
    topology's places are returned.
    """
    slow = slow_ways_out(topology, matrix, threshold_ratio)
    default = topology.positions_in_rack()
    places = list(default)
    for group in topology.rack_groups():
        for place, r in enumerate(sorted(group, key=lambda r: (slow[r], default[r]))):
            places[r] = place
    return tuple(places)


def rotation_changed(current: Sequence[Partition], proposed: Sequence[Partition]) -> bool:
    """Whether the rotation built from a measurement uses other groups (module step 4).

    Compares the cycles of partitions (``partition(step)`` over a period), so a new
    measurement that leads to the same groups, e.g. a slow link that no group uses,
    rebuilds nothing.
    """
    return tuple(current) != tuple(proposed)


def adapted_rotation(current: RotationSchedule, matrix, keep_racks: bool,
                     cross_ranks: Optional[int] = None,
                     threshold_ratio: float = THRESHOLD_RATIO
                     ) -> Tuple[MeasuredTopology, Optional[RotationSchedule]]:
    """The rotation a new measurement calls for, or ``None`` if it is the running one.

    1. :func:`measured_topology` on the running topology's hosts, keeping its racks if
       ``keep_racks`` (they came from labels or from the user);
    2. a :class:`RotationSchedule` with the running one's ``intra_phases`` and
       ``split_hosts``, ``cross_ranks`` (``None``: all of the widest rack, as in
       :class:`hvdx.DSSync`) clamped to the widest rack, and the measured places;
    3. ``None`` unless :func:`rotation_changed`;
    4. hysteresis: ``None`` as well when the racks are the running ones and no rank
       that crosses in the running rotation has a slow way out. The running rotation
       does not hurt then, and switching would cost new process sets for nothing: a
       recovered link, or noise that reorders ranks that are not slow, keeps it.

    A pure function of its arguments: ranks that hold the same matrix take the same
    decision.

    Returns:
        ``(measured, schedule or None)``.
    """
    t = current.topology
    measured = measured_topology(matrix, t.hosts, t.racks if keep_racks else None,
                                 threshold_ratio)
    proposed = rotation_on(current, measured.topology, measured.places, cross_ranks)
    cycle = [current.partition(s) for s in range(current.period)]
    new_cycle = [proposed.partition(s) for s in range(proposed.period)]
    if not rotation_changed(cycle, new_cycle):
        return measured, None
    same_racks = measured.topology.rack_groups() == t.rack_groups()
    crossing = [r for r in range(t.size) if current.places[r] < current.cross_ranks]
    if same_racks and proposed.cross_ranks == current.cross_ranks \
            and not any(measured.slow_out[r] for r in crossing):
        return measured, None
    return measured, proposed


def _labels(labels: Sequence[Hashable]) -> List[int]:
    seen = {}
    return [seen.setdefault(x, len(seen)) for x in labels]


def rotation_on(current: RotationSchedule, topology: Topology, places: Sequence[int],
                cross_ranks: Optional[int] = None) -> RotationSchedule:
    """``current``'s rotation (its ``intra_phases``, ``split_hosts``) on another topology.

    Step 2 of :func:`adapted_rotation`; also how a saved adaptation is rebuilt on resume.
    ``cross_ranks``: ``None`` for all of the widest rack, else clamped to it.
    """
    width = max(len(g) for g in topology.rack_groups())
    return RotationSchedule(topology, intra_phases=current.intra_phases,
                            cross_ranks=None if cross_ranks is None
                            else min(cross_ranks, width),
                            split_hosts=current.split_hosts, places=places)
