"""Where each rank sits: host and rack, and the groups a DS-Sync schedule draws from.

DS-Sync (Wang et al., "Divide-and-Shuffle Synchronization for Distributed Machine
Learning", arXiv 2007.03298) chooses groups so that their traffic avoids the network's
bottleneck, which in a rack cluster is the oversubscribed rack uplink. This module
describes the hierarchy the schedules of :mod:`hvdx.strategies.dssync.core_schedule` need:

1. a :class:`Topology` gives every rank a host and a rack. Ranks may be numbered in any
   order; labels are renumbered by first appearance in rank order, so every rank that
   builds it from the same gathered lists (an MPI shared-memory split for hosts, rack
   labels from the environment) holds an equal object with an equal :meth:`digest`;
2. every rank gets coordinates ``(local, host, rack)``: its index among its host's ranks,
   its host's index among its rack's hosts, and its rack. On a *regular* topology (every
   rack the same number of hosts, every host the same number of ranks) these are the
   digits of a mixed-radix number with radices :func:`mixed_radix`;
3. :func:`digit_groups` groups the ranks that differ only in one digit. It is defined on
   the coordinates, so it also works on irregular topologies, where it falls back to
   groups by level (same host; same local index in one rack; same place in every rack)
   whose sizes may differ;
4. :func:`groups_from_bandwidth` and :func:`slow_links` turn a measured rank-to-rank
   bandwidth matrix into "fast" groups. They are the pure half of the bandwidth probe
   that the MPI layer will run when no rack labels are given.

A *partition* everywhere in hvdx is a tuple of groups, each a sorted tuple of ranks,
groups ordered by their smallest rank.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Hashable, Optional, Sequence, Tuple

import numpy as np

from hvdx.core.validation import check_integer

__all__ = [
    "Partition",
    "Topology",
    "canonical",
    "digit_groups",
    "groups_from_bandwidth",
    "mixed_radix",
    "slow_links",
]

#: Groups of ranks: sorted tuples, ordered by their smallest rank.
Partition = Tuple[Tuple[int, ...], ...]

#: Digit names of :func:`digit_groups`, least significant first.
DIGITS = ("local", "host", "rack")


def canonical(groups) -> Partition:
    """Sorts each group and orders the groups by their smallest rank (empty groups last)."""
    ordered = [tuple(sorted(int(r) for r in g)) for g in groups]
    return tuple(sorted(ordered, key=lambda g: (len(g) == 0, g[:1], g)))


@dataclass(frozen=True)
class Topology:
    """Host and rack of every rank (index = rank).

    Construct with :meth:`from_counts` (a regular cluster numbered rack by rack, host by
    host, as an MPI hostfile lists it) or :meth:`from_ranks` (per-rank labels). Direct
    construction takes non-negative integer labels and renumbers them by first
    appearance in rank order.

    Attributes:
        hosts: host index of every rank. Host labels are global: a host is in one rack.
        racks: rack index of every rank.
    """

    hosts: Tuple[int, ...]
    racks: Tuple[int, ...]

    def __post_init__(self):
        hosts, racks = tuple(self.hosts), tuple(self.racks)
        if not hosts:
            raise ValueError("hosts=() must name the host of at least one rank")
        if len(racks) != len(hosts):
            raise ValueError(f"racks has {len(racks)} entries but hosts has {len(hosts)}: "
                             "give one rack and one host per rank")
        for name, labels in (("hosts", hosts), ("racks", racks)):
            for rank, label in enumerate(labels):
                if isinstance(label, bool) or not isinstance(label, (int, np.integer)) \
                        or label < 0:
                    raise ValueError(f"{name}[{rank}]={label!r} must be a non-negative "
                                     "integer (use Topology.from_ranks for other labels)")
        rack_of_host = {}
        for rank, (host, rack) in enumerate(zip(hosts, racks)):
            if rack_of_host.setdefault(host, rack) != rack:
                raise ValueError(f"racks: host {host} holds ranks in racks "
                                 f"{rack_of_host[host]} and {rack} (rank {rank}); "
                                 "a host must be in one rack")
        object.__setattr__(self, "hosts", _first_appearance(hosts))
        object.__setattr__(self, "racks", _first_appearance(racks))

    @classmethod
    def from_counts(cls, racks: int, hosts_per_rack: int, ranks_per_host: int = 1) -> "Topology":
        """A regular cluster, ranks numbered rack by rack, host by host.

        Rank ``r`` has digits ``local = r % ranks_per_host``,
        ``host = r // ranks_per_host % hosts_per_rack`` and
        ``rack = r // (ranks_per_host * hosts_per_rack)``.
        """
        for name, value in (("racks", racks), ("hosts_per_rack", hosts_per_rack),
                            ("ranks_per_host", ranks_per_host)):
            check_integer(name, value, 1)
        ranks = np.arange(racks * hosts_per_rack * ranks_per_host)
        return cls(tuple(int(h) for h in ranks // ranks_per_host),
                   tuple(int(r) for r in ranks // (ranks_per_host * hosts_per_rack)))

    @classmethod
    def from_ranks(cls, hosts: Sequence[Hashable],
                   racks: Optional[Sequence[Hashable]] = None) -> "Topology":
        """From per-rank labels of any hashable kind (host names, rack names, colours).

        Args:
            hosts: one label per rank, equal for ranks on one host (e.g. the world rank
                of rank 0 of an ``MPI_COMM_TYPE_SHARED`` split, or the host name).
            racks: one label per rank; ``None``: one rack for everyone.
        """
        hosts = list(hosts)
        racks = [0] * len(hosts) if racks is None else list(racks)
        if len(racks) != len(hosts):
            raise ValueError(f"racks has {len(racks)} entries but hosts has {len(hosts)}: "
                             "give one rack and one host per rank")
        return cls(_first_appearance(hosts), _first_appearance(racks))

    # --- sizes ------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Number of ranks."""
        return len(self.hosts)

    @property
    def n_racks(self) -> int:
        return max(self.racks) + 1

    @property
    def n_hosts(self) -> int:
        return max(self.hosts) + 1

    def rack_groups(self) -> Partition:
        """The ranks of each rack."""
        return _group_by(self.racks)

    def host_groups(self) -> Partition:
        """The ranks of each host."""
        return _group_by(self.hosts)

    def is_regular(self) -> bool:
        """Every rack has as many hosts, and every host as many ranks, as the others."""
        return mixed_radix(self) is not None

    # --- coordinates ------------------------------------------------------------------

    def coordinates(self) -> Tuple[Tuple[int, int, int], ...]:
        """``(local, host, rack)`` of every rank (see the module docstring, step 2).

        ``local`` orders a host's ranks by rank; ``host`` orders a rack's hosts by their
        first (smallest) rank.
        """
        local = {}
        for ranks in self.host_groups():
            local.update((r, i) for i, r in enumerate(ranks))
        host_in_rack = {}
        for ranks in self.rack_groups():
            hosts = _first_appearance([self.hosts[r] for r in ranks], raw=True)
            host_in_rack.update((h, i) for i, h in enumerate(hosts))
        return tuple((local[r], host_in_rack[self.hosts[r]], self.racks[r])
                     for r in range(self.size))

    def positions_in_rack(self) -> Tuple[int, ...]:
        """Every rank's place in its rack, ordered by ``(local, host)``.

        The first places go to the first rank of every host, then the second, ...: so the
        ``c`` ranks of a rack that cross in a DS-Sync cross phase sit on ``c`` different
        hosts whenever the rack has that many (the order :mod:`hvdx.core.cost_model`
        prices). On a regular topology, place ``p`` is ``local * hosts_per_rack + host``.
        """
        coords = self.coordinates()
        position = [0] * self.size
        for ranks in self.rack_groups():
            for p, r in enumerate(sorted(ranks, key=lambda r: coords[r][:2])):
                position[r] = p
        return tuple(position)

    def digest(self) -> str:
        """A short hash of the hierarchy, for :class:`hvdx.core.fingerprint.Fingerprint`."""
        h = hashlib.sha256()
        h.update(f"hosts={list(self.hosts)};racks={list(self.racks)}".encode())
        return h.hexdigest()[:16]


def mixed_radix(topology: Topology) -> Optional[Tuple[int, int, int]]:
    """``(ranks_per_host, hosts_per_rack, racks)`` of a regular topology, else ``None``.

    On a regular topology every rank's coordinates are the digits of a mixed-radix
    number with these radices, and ``digit_groups(topology, d)`` has groups of the
    radix of ``d``. An
    irregular one has no radices; its digit groups are groups by level of unequal size
    (the DS-Sync schedules then still preserve the mean but no longer reach the exact
    global mean in ``D`` phases).
    """
    per_host = {len(g) for g in topology.host_groups()}
    per_rack = {len({topology.hosts[r] for r in g}) for g in topology.rack_groups()}
    if len(per_host) != 1 or len(per_rack) != 1:
        return None
    return per_host.pop(), per_rack.pop(), topology.n_racks


def digit_groups(topology: Topology, digit: str) -> Partition:
    """The ranks that differ only in ``digit`` (``"local"``, ``"host"`` or ``"rack"``).

    - ``"local"``: the ranks of one host;
    - ``"host"``: the ranks of one rack with the same local index (one per host);
    - ``"rack"``: the ranks with the same ``(local, host)`` (one per rack: they cross).
    """
    if digit not in DIGITS:
        raise ValueError(f"digit={digit!r} must be one of {', '.join(DIGITS)}")
    drop = DIGITS.index(digit)
    keys = [tuple(c for i, c in enumerate(xyz) if i != drop) for xyz in topology.coordinates()]
    return _group_by(keys)


def groups_from_bandwidth(matrix, threshold_ratio: float = 0.5) -> Partition:
    """Fast groups: connected components of the links at least ``threshold_ratio * max``.

    The input of the bandwidth probe the MPI layer will run (every pair of ranks times a
    transfer, the matrix is allgathered, every rank calls this on the same matrix):

    1. a link ``(i, j)`` is ``min(matrix[i, j], matrix[j, i])`` (a link is as fast as its
       slower direction); the diagonal is ignored;
    2. a link is fast if it is at least ``threshold_ratio`` times the fastest link;
    3. ranks joined by a path of fast links form one group (so one noisy measurement
       inside a host or rack does not split it).

    Args:
        matrix: ``n x n`` measured bandwidths (any unit), finite and not negative.
        threshold_ratio: in ``(0, 1]``.

    Returns:
        A partition; with all links equally fast, one group of everyone.
    """
    links = _links(matrix)
    ratio = _ratio(threshold_ratio)
    n = links.shape[0]
    fastest = links.max() if n > 1 else 0.0
    fast = (links >= ratio * fastest) & (fastest > 0)
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in zip(*np.nonzero(np.triu(fast, 1))):
        parent[root(int(i))] = root(int(j))
    return _group_by([root(i) for i in range(n)])


def slow_links(matrix, threshold_ratio: float = 0.5) -> Tuple[Tuple[int, int], ...]:
    """The pairs ``(i, j)``, ``i < j``, whose link is below ``threshold_ratio * max``.

    The links a DS-Sync schedule should cross rarely (uplinks, in a rack cluster).
    Links are measured as in :func:`groups_from_bandwidth`.
    """
    links = _links(matrix)
    ratio = _ratio(threshold_ratio)
    n = links.shape[0]
    if n < 2:
        return ()
    slow = np.triu(links < ratio * links.max(), 1)
    return tuple((int(i), int(j)) for i, j in zip(*np.nonzero(slow)))


# --- helpers ----------------------------------------------------------------------------

def _first_appearance(labels, raw: bool = False):
    """Labels renumbered 0, 1, ... in order of first appearance (``raw``: distinct labels)."""
    seen = {}
    for label in labels:
        seen.setdefault(label, len(seen))
    if raw:
        return list(seen)
    return tuple(seen[label] for label in labels)


def _group_by(keys: Sequence[Hashable]) -> Partition:
    groups = {}
    for rank, key in enumerate(keys):
        groups.setdefault(key, []).append(rank)
    return canonical(groups.values())


def _links(matrix) -> np.ndarray:
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] == 0:
        raise ValueError(f"matrix has shape {m.shape}; it must be square, one row per rank")
    if not np.all(np.isfinite(m)) or np.any(m < 0):
        raise ValueError("matrix must hold finite, non-negative bandwidths")
    links = np.minimum(m, m.T)
    np.fill_diagonal(links, 0.0)
    return links


def _ratio(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not 0 < value <= 1 or not math.isfinite(value):
        raise ValueError(f"threshold_ratio={value!r} must be in (0, 1]")
    return float(value)
