"""Which ranks the calibration job pairs up, from every rank's host and rack labels:
the swaps (step 2, :func:`pair_sets`), the shifts (step 4, :func:`shift_sets`) and the
one-way rounds (step 5, :func:`oneway_sets`). Pure functions of the labels.

Step numbers are those of :mod:`hvdx.mpi.calibrate`, which runs the job.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

__all__ = ["Pairs", "oneway_sets", "pair_sets", "rack_members", "shift_sets"]

Pairs = List[Tuple[int, int]]


def _one_per_host(ranks: Sequence[int], hosts: Sequence[int]) -> List[int]:
    """``ranks`` ordered so that each host's first rank comes before any host's second."""
    seen: Dict[int, int] = {}
    keyed = []
    for r in ranks:
        keyed.append((seen.get(hosts[r], 0), r))
        seen[hosts[r]] = seen.get(hosts[r], 0) + 1
    return [r for _, r in sorted(keyed)]


def rack_members(racks: Sequence[object]) -> Dict[object, List[int]]:
    """Each rack label (in the order ranks first name it) -> its ranks, in rank order."""
    members: Dict[object, List[int]] = {}
    for rank, label in enumerate(racks):
        members.setdefault(label, []).append(rank)
    return members


def pair_sets(hosts: Sequence[int], racks: Sequence[object]) -> List[Tuple[str, int, Pairs]]:
    """Step 2: ``(link class, flows per link, pairs)`` for every measurement.

    Pure: ``hosts[r]`` and ``racks[r]`` are rank ``r``'s host and rack labels.
    """
    members = rack_members(racks)
    order = list(members)
    sets: List[Tuple[str, int, Pairs]] = []
    if len(order) > 1:
        a = _one_per_host(members[order[0]], hosts)
        b = _one_per_host(members[order[1]], hosts)
        hosts_a = len({hosts[r] for r in a})
        hosts_b = len({hosts[r] for r in b})
        most = min(hosts_a, hosts_b)
        counts = sorted({c for c in (1, 2, 4, 8, 16, most) if c <= most})
        for c in counts:
            sets.append(("uplink", c, list(zip(a[:c], b[:c]))))
    per_host = max(hosts.count(h) for h in set(hosts))
    host_pairs = []  # (ranks of host h0, ranks of host h1): hosts of one rack, paired
    for label in order:
        by_host: Dict[int, List[int]] = {}
        for r in members[label]:
            by_host.setdefault(hosts[r], []).append(r)
        rack_hosts = list(by_host)
        host_pairs += [(by_host[h0], by_host[h1])
                       for h0, h1 in zip(rack_hosts[0::2], rack_hosts[1::2])]
    if host_pairs:
        sets.append(("nic", 1, [(r0[0], r1[0]) for r0, r1 in host_pairs]))
        if per_host > 1:
            sets.append(("nic", per_host,
                         [pair for r0, r1 in host_pairs for pair in zip(r0, r1)]))
    same: Pairs = []
    for h in dict.fromkeys(hosts):
        local = [r for r in range(len(hosts)) if hosts[r] == h]
        same += list(zip(local[0::2], local[1::2]))
    if same:
        sets.append(("intra-host", 1, same))
    return sets


def shift_sets(hosts: Sequence[int], racks: Sequence[object]) -> List[Tuple[str, int, Pairs]]:
    """Step 4: ``(link class, flows per link each way, directed edges)``.

    Pure: the uplink's rings go ``a0 -> b0 -> a1 -> b1 -> ... -> a0`` through the first
    ``c`` hosts of the first two racks (``c = 1`` is a swap); the NIC's ring goes through
    each rack's hosts in order, every rack at once (only with three hosts or more in a
    rack: two make a swap, which step 3 timed).
    """
    members = rack_members(racks)
    order = list(members)
    sets: List[Tuple[str, int, Pairs]] = []
    for link, flows, pairs in pair_sets(hosts, racks):
        if link == "uplink" and flows > 1:
            ring = [r for pair in pairs for r in pair]
            sets.append(("uplink", flows, list(zip(ring, ring[1:] + ring[:1]))))
    edges: Pairs = []
    for label in order:
        firsts = list(dict.fromkeys(hosts[r] for r in members[label]))
        ring = [next(r for r in members[label] if hosts[r] == h) for h in firsts]
        if len(ring) > 2:
            edges += list(zip(ring, ring[1:] + ring[:1]))
    if edges:
        sets.append(("nic", 1, edges))
    return sets


def oneway_sets(hosts: Sequence[int], racks: Sequence[object]) -> List[Tuple[str, int, Pairs]]:
    """Step 5: ``(link class, flows per link one way, directed edges)``: the
    pairs of :func:`pair_sets` (intra-host's aside), each sending from its first rank to
    its second. Pure."""
    return [s for s in pair_sets(hosts, racks) if s[0] != "intra-host"]

