"""Measured transfer times per link class: what calibrates the cost model.

The alpha-beta model of :mod:`hvdx.core.cost_model` prices a message at the configured
link rate plus a fixed start-up cost. Measured on the emulated cluster, MPICH over TCP
falls short of that in three ways the rates alone cannot say: a bulk transfer reaches
60-95% of the shaped rate depending on its size and on how many flows share the link
(TCP restarts slow start after every idle gap, and shaped queues drop), a round of small
messages costs milliseconds rather than microseconds (ranks that outnumber the cores
wait for the scheduler), and links between hosts of one rack run well below their rate.
A :class:`Calibration` holds what a calibration job (:mod:`hvdx.mpi.calibrate`) measured
instead, and the cost model prices every phase from it:

1. per link class (``"uplink"``: between racks; ``"nic"``: between hosts of one rack;
   ``"intra-host"``: between ranks of one host), for ``flows`` concurrent flows through
   one link each way and a message of ``nbytes`` per flow, the seconds one bidirectional
   exchange round took (every flow's partner sends back at the same time, as the rounds
   of MPI's collectives do);
2. :meth:`Calibration.round_s` interpolates those tables: linearly in bytes between two
   measured sizes (time is close to affine in the size), with the last segment's slope
   beyond the largest size, the smallest size's time below it; linearly between two
   measured flow counts, scaled by the count beyond the largest (flows share a link
   evenly);
3. ``allreduce``: the algorithm the MPI library runs for an allreduce
   (``"recursive_halving"``, MPICH's: Thakur, Rabenseifner & Gropp, IJHPCA 2005; or
   ``"ring"``, NCCL's), which the cost model lays out round by round;
4. ``shift_tables``: the same for shifts, rounds in which every rank sends to one rank
   and receives from another (a directed ring over the pairs' ranks: each link carries
   the same number of flows each way, on different connections), as decentralized
   SGD's hops move; a phase whose flows are not all swapped in pairs is priced from
   them where they were measured, and so is hvdx's own exchange, swaps included. A swap
   and a shift through the same shaped link did not run at the same rate: a 4 MiB swap
   reached 47 Mbit/s per 100 Mbit NIC where the graph's hops reached about 70. The
   swaps are timed as MPI's collectives run them, receives posted first, and then one
   direction often waits for the other (5.4 MB, two pairs through a 20 Mbit uplink:
   4.7-9.0 s); hvdx's exchange posts its sends first and moves such a swap as a shift
   (4.6-5.4 s, 20 of 20);
5. ``oneway_tables``: the same for flows that load a link one way only (nothing comes
   back on it, as Stanza's activations go to the FC worker and its gradients come back
   in a later phase): through a shaped link, 2 x 128 KiB one way took 23 ms where the
   same bytes as a shift took 30 (the shift's returning data shares the queues);
6. ``allreduce_times``: where the calibration also timed the MPI allreduce itself on
   the groups the strategies use (:data:`ALLREDUCE_GROUPS`: all ranks, each rack's
   ranks at once, one rank per rack in each of several groups at once), the cost model
   takes those times for an allreduce on such groups (interpolated in bytes as in step
   2) instead of adding up its rounds: the collective as measured includes what the
   rounds miss (the library's own copies and reductions, the rounds' waits on each
   other);
7. ``allgather_times`` and ``alltoall_times``: likewise, hvdx's own sparse collectives
   (:func:`hvdx.mpi.sparse.allgatherv_pairs` and :func:`~hvdx.mpi.sparse.alltoallv_pairs`:
   the lengths first, then the pairs) timed on all ranks, by the bytes each rank
   contributes (an alltoall: all its pieces together, one per rank). TopK's phases
   take them: priced as rings, 27 KB per rank gathered through a 20 Mbit uplink came to
   35 ms where it took 67 (MPICH gathers small messages by recursive doubling, whose
   swaps run as step 4 says);
8. ``set_allreduce_times``: where the calibration could also run Horovod, the average
   DS-Sync runs (Horovod's grouped allreduce on process sets, with the sets registered
   dynamically as DS-Sync registers them) timed on the same groups, once after a
   barrier as DS-Sync's step runs it, the mean of many runs; the cost model
   takes it for DS-Sync's averages on such groups, negotiation and background cycles
   included, in place of MPI's allreduce plus the small collectives it adds for them:
   on the emulated 2x2 cluster a 5.5 MB average on the rack sets took 115-194 ms where
   MPI's allreduce on the same ranks took 82-86 (4 ranks sharing 2 cores: Horovod's
   machinery, not the wire). With several racks, Horovod's own average on all ranks
   (``"world"``) is timed too, for small models. ``local_set_allreduce_times``: the same
   averages timed with every rank on one host (``hvdx bench``'s local runs), where
   Horovod's machinery costs about as much and the wire nothing; a local step already
   holds that part, so a plan built on one adds only the difference
   (:meth:`Calibration.set_allreduce_beyond_local_s`). With ranks pinned to cores,
   150 KB on the 2x2 cluster took 24 ms on the rack sets and 74 ms on all ranks; on
   one host, 25 and 50 ms: DS-Sync's step gained 6 ms on the cluster, Horovod's 34;
9. ``sharded_topk_times``: sharded TopK's two collectives as its step runs them, once
   each after compute rather than back to back: the alltoall of the uplink pairs, then
   the allgather of the downlink shards, whose bytes per rank are the uplink's times
   ``m / n`` for a downlink ``m`` times as dense as the uplink, for each timed ``m``.
   The cost model takes it for sharded TopK where ``m`` lies within the timed ones
   (linear between two), in place of step 7's two times added: through a 20 Mbit
   uplink, 110 KB up then 55 KB down a rank took 188-201 ms where step 7's times add
   to 162, and 110 KB up alone 55-59 ms where back to back it averaged 80.

Pure numpy and standard library; saved and loaded as JSON.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = ["ALLREDUCE_ALGORITHMS", "ALLREDUCE_GROUPS", "Calibration", "LINK_CLASSES"]

#: The link classes a calibration measures, as the cost model names its links.
LINK_CLASSES = ("uplink", "nic", "intra-host")
#: How the MPI library runs an allreduce (:mod:`hvdx.core.cost_model` lays out both).
ALLREDUCE_ALGORITHMS = ("recursive_halving", "ring")
#: The groups an allreduce is timed on (module step 6): ``"world"`` (every rank),
#: ``"rack"`` (each rack's ranks, all racks at once), ``"cross"`` (the ``j``-th rank of
#: every rack, for every ``j`` at once: DS-Sync's crossing groups).
ALLREDUCE_GROUPS = ("world", "rack", "cross")

Table = Dict[int, List[Tuple[float, float]]]  # flows -> [(bytes per flow, seconds)]


def _interpolate(points: Sequence[Tuple[float, float]], nbytes: float) -> float:
    """Seconds for ``nbytes`` from sorted ``(bytes, seconds)`` points (module step 2)."""
    if len(points) == 1 or nbytes <= points[0][0]:
        if len(points) == 1:
            return points[0][1] * max(1.0, nbytes / points[0][0]) if points[0][0] else \
                points[0][1]
        return points[0][1]
    for (b0, t0), (b1, t1) in zip(points, points[1:]):
        if nbytes <= b1:
            return t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0)
    (b0, t0), (b1, t1) = points[-2], points[-1]
    return t1 + max(0.0, (t1 - t0) / (b1 - b0)) * (nbytes - b1)


@dataclass(frozen=True)
class Calibration:
    """Transfer times measured on one cluster (module docstring).

    Attributes:
        tables: link class -> flows per link -> ``[(bytes per flow, seconds)]``, sizes
            increasing; seconds of one bidirectional exchange round.
        allreduce: one of :data:`ALLREDUCE_ALGORITHMS`.
        source: where it was measured (free text: the cluster, the MPI library).
    """

    tables: Mapping[str, Table]
    allreduce: str = "recursive_halving"
    source: str = ""
    #: As ``tables``, for shifts (module step 4).
    shift_tables: Mapping[str, Table] = field(default_factory=dict)
    #: As ``tables``, for flows that load a link one way only (module step 5).
    oneway_tables: Mapping[str, Table] = field(default_factory=dict)
    #: group (:data:`ALLREDUCE_GROUPS`) -> ``[(bytes per rank, seconds)]`` (step 6).
    allreduce_times: Mapping[str, List[Tuple[float, float]]] = field(default_factory=dict)
    #: ``[(bytes per rank, seconds)]`` of hvdx's allgather and alltoall on all ranks
    #: (module step 7); empty: not timed.
    allgather_times: List[Tuple[float, float]] = field(default_factory=list)
    alltoall_times: List[Tuple[float, float]] = field(default_factory=list)
    #: group -> ``[(bytes per rank, seconds)]`` of Horovod's average on process sets
    #: (module step 8); empty: Horovod was not timed.
    set_allreduce_times: Mapping[str, List[Tuple[float, float]]] = field(default_factory=dict)
    #: The same averages timed with every rank on one host, standing in for this
    #: cluster (module step 8); empty: not timed.
    local_set_allreduce_times: Mapping[str, List[Tuple[float, float]]] = \
        field(default_factory=dict)
    #: downlink multiple ``m`` -> ``[(uplink bytes per rank, seconds)]`` of sharded
    #: TopK's alltoall then allgather (module step 9); empty: not timed.
    sharded_topk_times: Mapping[float, List[Tuple[float, float]]] = field(default_factory=dict)
    #: Not compared: two calibrations are equal if they measured the same.
    notes: Tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self):
        if self.allreduce not in ALLREDUCE_ALGORITHMS:
            raise ValueError(f"allreduce={self.allreduce!r} must be one of "
                             f"{', '.join(ALLREDUCE_ALGORITHMS)}")
        clean = self._checked("tables", self.tables)
        if not clean:
            raise ValueError("tables measured no link class")
        object.__setattr__(self, "tables", clean)
        for name in ("shift_tables", "oneway_tables"):
            object.__setattr__(self, name, self._checked(name, getattr(self, name)))
        for name in ("allreduce_times", "set_allreduce_times", "local_set_allreduce_times"):
            for group in dict(getattr(self, name)):
                if group not in ALLREDUCE_GROUPS:
                    raise ValueError(f"{name}[{group!r}]: the groups are "
                                     f"{', '.join(ALLREDUCE_GROUPS)}")
            object.__setattr__(self, name, {
                group: _points(f"{name}[{group!r}]", points)
                for group, points in dict(getattr(self, name)).items()})
        for name in ("allgather_times", "alltoall_times"):
            points = getattr(self, name)
            object.__setattr__(self, name, _points(name, points) if points else [])
        sharded = {}
        for multiple, points in dict(self.sharded_topk_times).items():
            if isinstance(multiple, bool) or not isinstance(multiple, (int, float)) or \
                    not 0 < multiple < math.inf:
                raise ValueError(f"sharded_topk_times[{multiple!r}]: a key is how many "
                                 "times as dense the downlink is as the uplink, a number > 0")
            sharded[float(multiple)] = _points(f"sharded_topk_times[{multiple!r}]", points)
        object.__setattr__(self, "sharded_topk_times", dict(sorted(sharded.items())))

    @staticmethod
    def _checked(name: str, tables: Mapping[str, Table]) -> Dict[str, Table]:
        clean: Dict[str, Table] = {}
        for link, table in dict(tables).items():
            if link not in LINK_CLASSES:
                raise ValueError(f"{name} has link class {link!r}; the classes are "
                                 f"{', '.join(LINK_CLASSES)}")
            rows: Table = {}
            for flows, points in dict(table).items():
                where = f"{name}[{link!r}][{flows}]"
                if int(flows) < 1:
                    raise ValueError(f"{where}: flows must be at least 1")
                rows[int(flows)] = _points(where, points)
            if rows:
                clean[link] = rows
        return clean

    def has(self, link: str) -> bool:
        """Whether ``link`` was measured."""
        return link in self.tables

    def round_s(self, link: str, flows: float, nbytes: float, shift: bool = False,
                oneway: bool = False) -> float:
        """Seconds of one exchange round: ``flows`` flows of ``nbytes`` each through one
        ``link`` each way (module step 2); with ``oneway`` (nothing comes back the other
        way), from the one-way rounds where ``link``'s were measured (step 5); else with
        ``shift``, from the shifts where they were (step 4); else from the swaps.

        Raises:
            KeyError: naming ``link`` if it was not measured.
        """
        if link not in self.tables:
            raise KeyError(f"link class {link!r} was not calibrated (measured: "
                           f"{', '.join(self.tables)})")
        table = self.tables[link]
        if oneway and link in self.oneway_tables:
            table = self.oneway_tables[link]
        elif shift and link in self.shift_tables:
            table = self.shift_tables[link]
        counts = sorted(table)
        flows = max(1.0, float(flows))
        if flows >= counts[-1]:
            top = counts[-1]
            # Beyond the most flows measured the link is shared evenly: flows * bytes
            # move at the rate ``top`` flows reached together.
            return _interpolate(table[top], nbytes * flows / top)
        lower = max(c for c in counts if c <= flows) if flows >= counts[0] else counts[0]
        upper = min(c for c in counts if c >= flows)
        low = _interpolate(table[lower], nbytes) if flows >= counts[0] else \
            _interpolate(table[lower], nbytes * flows / lower)
        if upper == lower:
            return low
        high = _interpolate(table[upper], nbytes)
        return low + (high - low) * (flows - lower) / (upper - lower)

    def allreduce_s(self, group: str, nbytes: float) -> Optional[float]:
        """Seconds of an allreduce of ``nbytes`` on ``group`` (module step 6), or
        ``None`` if that group was not timed."""
        points = self.allreduce_times.get(group)
        return None if points is None else _interpolate(points, nbytes)

    def set_allreduce_s(self, group: str, nbytes: float) -> Optional[float]:
        """Seconds of Horovod's average of ``nbytes`` on the process sets of ``group``
        (module step 8), or ``None`` if that group was not timed through Horovod."""
        points = self.set_allreduce_times.get(group)
        return None if points is None else _interpolate(points, nbytes)

    def set_allreduce_beyond_local_s(self, group: str, nbytes: float) -> Optional[float]:
        """Of :meth:`set_allreduce_s`, what the cluster adds to the same average with
        every rank on one host (module step 8), never below zero; ``None`` if either
        was not timed for ``group``, or ``nbytes`` lies beyond the sizes both timed."""
        cluster = self.set_allreduce_times.get(group)
        local = self.local_set_allreduce_times.get(group)
        if not cluster or not local or nbytes > min(cluster[-1][0], local[-1][0]):
            return None
        return max(0.0, _interpolate(cluster, nbytes) - _interpolate(local, nbytes))

    def allgather_s(self, nbytes: float) -> Optional[float]:
        """Seconds of hvdx's allgather of ``nbytes`` per rank on all ranks (module
        step 7), or ``None`` if it was not timed."""
        return _interpolate(self.allgather_times, nbytes) if self.allgather_times else None

    def alltoall_s(self, nbytes: float) -> Optional[float]:
        """Seconds of hvdx's alltoall of ``nbytes`` per rank (all its pieces) on all
        ranks (module step 7), or ``None`` if it was not timed."""
        return _interpolate(self.alltoall_times, nbytes) if self.alltoall_times else None

    def sharded_topk_s(self, up_bytes: float, multiple: float) -> Optional[float]:
        """Seconds of sharded TopK's alltoall of ``up_bytes`` per rank, then its allgather
        of a downlink ``multiple`` times as dense (module step 9): interpolated in bytes,
        then linearly between the two timed multiples around ``multiple``; ``None``
        outside the timed multiples."""
        timed = self.sharded_topk_times  # sorted by multiple (__post_init__)
        if not timed or not min(timed) - 1e-9 <= multiple <= max(timed) + 1e-9:
            return None
        return _interpolate([(m, _interpolate(points, up_bytes))
                             for m, points in timed.items()], multiple)

    def latency_s(self, link: str) -> float:
        """The smallest measured round on ``link`` (one flow): its start-up cost."""
        table = self.tables[link]
        return table[min(table)][0][1]

    def to_dict(self) -> Dict[str, object]:
        """A JSON-ready dict (:meth:`from_dict` reads it back)."""
        return {"allreduce": self.allreduce, "source": self.source,
                "notes": list(self.notes),
                "allreduce_times": {g: [list(p) for p in pts]
                                    for g, pts in self.allreduce_times.items()},
                "allgather_times": [list(p) for p in self.allgather_times],
                "alltoall_times": [list(p) for p in self.alltoall_times],
                "set_allreduce_times": {g: [list(p) for p in pts]
                                        for g, pts in self.set_allreduce_times.items()},
                "local_set_allreduce_times": {
                    g: [list(p) for p in pts]
                    for g, pts in self.local_set_allreduce_times.items()},
                "sharded_topk_times": {repr(m): [list(p) for p in pts]
                                       for m, pts in self.sharded_topk_times.items()},
                "tables": _plain(self.tables), "shift_tables": _plain(self.shift_tables),
                "oneway_tables": _plain(self.oneway_tables)}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> "Calibration":
        """The calibration :meth:`to_dict` wrote.

        Raises:
            ValueError: if ``data`` is not one.
        """
        if not isinstance(data, Mapping) or not isinstance(data.get("tables"), Mapping):
            raise ValueError("a calibration is a JSON object with 'tables' (link class -> "
                             "flows -> [[bytes, seconds], ...]); this is not one")
        return cls(tables=_parsed(data["tables"]),
                   shift_tables=_parsed(data.get("shift_tables") or {}),
                   oneway_tables=_parsed(data.get("oneway_tables") or {}),
                   allreduce=str(data.get("allreduce", "recursive_halving")),
                   source=str(data.get("source", "")),
                   notes=tuple(str(n) for n in data.get("notes", ())),
                   allreduce_times={g: [tuple(p) for p in pts] for g, pts in
                                    dict(data.get("allreduce_times") or {}).items()},
                   allgather_times=[tuple(p) for p in data.get("allgather_times") or ()],
                   alltoall_times=[tuple(p) for p in data.get("alltoall_times") or ()],
                   set_allreduce_times={g: [tuple(p) for p in pts] for g, pts in
                                        dict(data.get("set_allreduce_times") or {}).items()},
                   local_set_allreduce_times={
                       g: [tuple(p) for p in pts] for g, pts in
                       dict(data.get("local_set_allreduce_times") or {}).items()},
                   sharded_topk_times={_multiple(m): [tuple(p) for p in pts] for m, pts in
                                       dict(data.get("sharded_topk_times") or {}).items()})

    def save(self, path: str) -> None:
        """Writes :meth:`to_dict` as JSON, atomically (a reader never sees half)."""
        from hvdx.atomic_file import write_atomically

        write_atomically(path, (json.dumps(self.to_dict(), indent=1) + "\n").encode())

    @classmethod
    def load(cls, path: str) -> "Calibration":
        """Reads a file :meth:`save` wrote.

        Raises:
            ValueError: naming ``path`` if it is not a calibration.
        """
        try:
            with open(path, encoding="utf-8") as handle:
                return cls.from_dict(json.load(handle))
        except (OSError, json.JSONDecodeError, ValueError, TypeError) as error:
            raise ValueError(f"calibration={path!r} is not a calibration file ({error}); "
                             "write one with `hvdx plan --calibrate FILE`") from error


def _points(where: str, points) -> List[Tuple[float, float]]:
    """``points`` sorted by size, checked: ``(bytes >= 0, seconds > 0)`` pairs."""
    points = sorted((float(b), float(s)) for b, s in points)
    if not points or any(b < 0 or not 0 < s < math.inf for b, s in points):
        raise ValueError(f"{where} must hold (bytes >= 0, seconds > 0) pairs, not "
                         f"{points!r}")
    return points


def _multiple(key: object) -> object:
    """A ``sharded_topk_times`` key as JSON wrote it (a string), as a number; one that
    is not a number is left for the check in :class:`Calibration`."""
    try:
        return float(key)
    except (TypeError, ValueError):
        return key


def _plain(tables: Mapping[str, Table]) -> Dict[str, Dict[str, List[List[float]]]]:
    return {link: {str(f): [list(p) for p in pts] for f, pts in t.items()}
            for link, t in tables.items()}


def _parsed(tables: Mapping[str, Mapping]) -> Dict[str, Table]:
    return {link: {int(f): [tuple(p) for p in pts] for f, pts in t.items()}
            for link, t in dict(tables).items()}
