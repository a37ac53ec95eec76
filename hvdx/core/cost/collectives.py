"""How the collectives the strategies run lay out their flows: ring and MPICH allreduces
(Thakur, Rabenseifner & Gropp, IJHPCA 2005), shifts, collectives at once on disjoint
ranks, and the few bytes Horovod adds to agree on each op.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np

from hvdx.core.cost.types import Cluster, Flow, _Traffic


def _rings(groups: np.ndarray, nbytes: float) -> List[Flow]:
    """Each row of ``groups`` is a ring in which every rank sends ``nbytes`` to the next."""
    if groups.shape[1] < 2:
        return []
    return [(groups.ravel(), np.roll(groups, -1, axis=1).ravel(), nbytes)]


def _allreduce(name: str, groups: np.ndarray, nbytes: float, weight: float = 1.0) -> _Traffic:
    """Ring allreduce in every row: reduce-scatter + allgather, 2(m-1) rounds."""
    m = groups.shape[1]
    return _Traffic(name, _rings(groups, 2 * (m - 1) / m * nbytes), 2 * (m - 1), weight)


#: MPICH runs recursive doubling at or below this many bytes
#: (``MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE``), recursive halving above.
MPICH_SHORT_ALLREDUCE_BYTES = 2048


def _recursive_halving(name: str, groups: np.ndarray, nbytes: float,
                       weight: float = 1.0) -> List[_Traffic]:
    """MPICH's allreduce in every row, round by round (Thakur, Rabenseifner & Gropp,
    "Optimization of collective communication operations in MPICH", IJHPCA 2005).

    1. with ``m`` not a power of two, ``rem = m - 2^floor(log2 m)``: the first ``rem``
       even positions send their whole buffer to the next (odd) position and sit out;
    2. above :data:`MPICH_SHORT_ALLREDUCE_BYTES`, reduce-scatter by recursive halving:
       round ``j`` (partner ``v XOR 2^j``, distance 1 first) exchanges half of what the
       previous round kept (``M/2``, ``M/4``, ...), then allgather by recursive doubling,
       the same rounds in reverse; at or below it, recursive doubling of the whole
       buffer, one round per power of two;
    3. the odd positions of step 1 send the result back.
    """
    m = groups.shape[1]
    if m < 2:
        return []
    pof2 = 1 << (m.bit_length() - 1)
    rem = m - pof2
    new = np.arange(pof2)
    real = np.where(new < rem, 2 * new + 1, new + rem)  # position of each new rank
    traffic = []
    if rem:
        evens, odds = 2 * np.arange(rem), 2 * np.arange(rem) + 1
        traffic.append(_Traffic(f"{name}: fold {rem} rank(s) in",
                                [(groups[:, evens].ravel(), groups[:, odds].ravel(), nbytes)],
                                1, weight))
    masks = [1 << j for j in range(pof2.bit_length() - 1)]
    if nbytes <= MPICH_SHORT_ALLREDUCE_BYTES:
        steps = [(mask, nbytes) for mask in masks]
    else:
        steps = [(mask, nbytes / (2 * mask)) for mask in masks]
        steps += steps[::-1]
    for mask, size in steps:
        src, dst = groups[:, real].ravel(), groups[:, real[new ^ mask]].ravel()
        traffic.append(_Traffic(f"{name}: exchange at distance {mask}", [(src, dst, size)],
                                1, weight))
    if rem:
        traffic.append(_Traffic(f"{name}: result out to {rem} rank(s)",
                                [(groups[:, odds].ravel(), groups[:, evens].ravel(), nbytes)],
                                1, weight))
    return traffic


def _as_measured(traffic: _Traffic, seconds: Optional[float]) -> _Traffic:
    """``traffic`` priced at the ``seconds`` a calibration timed for that very
    collective (its flows then only count its bytes); as it was if ``None``."""
    if seconds is None:
        return traffic
    return traffic._replace(name=traffic.name + " (measured)", measured_s=seconds)


def _allreduces(name: str, groups: np.ndarray, nbytes: float, c: "Cluster",
                weight: float = 1.0) -> List[_Traffic]:
    """The allreduce in every row as the cluster's MPI library runs it: MPICH's
    recursive halving when the calibration says so (:func:`_recursive_halving`), else
    a ring (:func:`_allreduce`)."""
    cal = c.calibration
    if cal is not None:
        measured = cal.allreduce_s(_group_kind(groups, c), nbytes) if groups.shape[1] > 1 \
            else None
        if measured is not None:
            return [_as_measured(_allreduce(name.replace("ring ", ""), groups, nbytes,
                                            weight), measured)]
        if cal.allreduce == "recursive_halving":
            return _recursive_halving(name.replace("ring ", ""), groups, nbytes, weight)
    return [_allreduce(name, groups, nbytes, weight)]


def _group_kind(groups: np.ndarray, c: "Cluster") -> Optional[str]:
    """Which of the calibration's timed groups (``"world"``, ``"rack"``, ``"cross"``)
    the rows of ``groups`` are, or ``None``."""
    rows = {frozenset(row.tolist()) for row in groups}
    grid = _grid(c)
    if rows == {frozenset(range(c.ranks))}:
        return "world"
    if c.racks > 1 and rows == {frozenset(row.tolist()) for row in grid}:
        return "rack"
    if c.racks > 1 and rows == {frozenset(col.tolist()) for col in grid.T}:
        return "cross"
    return None


def _at_once(name: str, *parts: List[_Traffic]) -> List[_Traffic]:
    """Several multi-round collectives on disjoint ranks at the same time: round ``i``
    of each runs together with round ``i`` of the others."""
    longest = max((len(p) for p in parts), default=0)
    out = []
    for i in range(longest):
        now = [p[i] for p in parts if i < len(p)]
        out.append(_Traffic(name if longest == 1 else f"{name}, round {i + 1}",
                            [f for t in now for f in t.flows], max(t.rounds for t in now),
                            now[0].weight))
    return out


def _shift(n: int, distance: int, nbytes: float) -> Flow:
    """Every rank ``i`` sends ``nbytes`` to ``(i + distance) mod n``."""
    src = np.arange(n)
    return src, (src + distance) % n, nbytes


def _grid(c: Cluster) -> np.ndarray:
    """Ranks as a racks x ranks_per_rack array: row ``j`` holds rack ``j``'s ranks in
    rank order (blocked placement: ``arange(n).reshape(racks, -1)``)."""
    return np.argsort(c.rack_of_rank, kind="stable").reshape(c.racks, c.ranks_per_rack)


#: Bytes of the bit vector Horovod's controller allreduces each cycle to agree on which
#: tensors are ready (its response cache; Sergeev & Del Balso, arXiv 1802.05799).
HOROVOD_NEGOTIATION_BYTES = 8


def _negotiation(groups: np.ndarray, c: Cluster) -> List[_Traffic]:
    """Horovod's per-step agreement in each process set: one allreduce of a few bytes
    (recursive doubling). Priced only with a calibration: measured small rounds cost
    milliseconds where ranks outnumber cores; at ``alpha`` = 25 us it would not show."""
    if c.calibration is None:
        return []
    return _allreduces("Horovod negotiation", groups, HOROVOD_NEGOTIATION_BYTES, c)


def _set_negotiation(groups: np.ndarray, c: Cluster) -> List[_Traffic]:
    """Horovod's agreement for an op on process sets of fewer ranks than the world:
    the set's own negotiation (:func:`_negotiation`), and what every cycle of Horovod's
    background loop asks of all ranks while the op waits, since with dynamic process
    sets (DS-Sync's mode) each cycle first agrees on the table of registered sets
    (``ProcessSetTable::InitializeRegisteredAndRemoveMarkedIfReady``: an allgather of
    two ints over all ranks, ``horovod/common/process_set.cc``) and coordinates the
    global set, whose controller negotiates every cycle like any set's. Both are a
    few bytes over all ranks, priced as the negotiation is, once per op (one cycle).
    On the emulated 2 x 2 cluster a 4-byte grouped allreduce on two-rank rack sets
    took 16-30 ms (medians of four series of 14) where the calibrations timed MPI's
    1 KiB allreduce on the same ranks at 0.2-8 ms."""
    if c.calibration is None or groups.shape[1] == c.ranks:
        return _negotiation(groups, c)
    everyone = np.arange(c.ranks)[None, :]
    return _negotiation(groups, c) + [
        t for what in ("Horovod cycle: process-set table agreement (all ranks)",
                       "Horovod cycle: global set's negotiation (all ranks)")
        for t in _allreduces(what, everyone, HOROVOD_NEGOTIATION_BYTES, c)]
