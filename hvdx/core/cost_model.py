"""Alpha-beta cost model: predicted step time of each hvdx strategy on a rack cluster.

Every message costs ``alpha + m / beta`` (Hockney, "The communication challenge for MPP",
Parallel Computing 20, 1994). Collectives are built from the standard algorithms of
Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in
MPICH" (IJHPCA 2005): a ring allreduce of ``M`` bytes over ``m`` ranks is a reduce-scatter
and an allgather, ``2(m-1)`` rounds, each rank sending ``2(m-1)/m * M`` bytes, which is
bandwidth-optimal (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for
clusters of workstations", JPDC 2009).

The network: every host has a NIC (``nic_bps`` each way), every rack one uplink to the
core (``uplink_bps`` each way), ranks on one host talk at ``intra_host_bps`` (``None``:
free). Ranks fill hosts in the order of the cluster's *placement*, ``ranks_per_host``
each, as an MPI hostfile lists them (:func:`host_order`): ``"blocked"`` lists the hosts
rack by rack (ranks ``0..W-1`` in rack 0), ``"interleaved"`` deals them out over the
racks in turn (rank ``r`` in rack ``r mod R`` with one rank per host). A ring follows rank
order; a strategy's groups "inside a rack" are the ranks that placement puts there. A
phase is a set of concurrent flows (src, dst, bytes); flows share links evenly (fluid
model), so the phase ends when its busiest link has moved its bytes::

    T_phase = rounds * alpha + max over links (bytes through the link, one way) / rate

Per strategy (``n`` ranks, ``R`` racks, ``W = n/R`` ranks per rack, ``M`` model bytes,
``k = ratio * params``, ``e`` bytes per element, ``p = 4 + e`` bytes per (int32 index,
value) pair, 8 for float32):

- horovod: one ring over all ranks. A rack-ordered ring (blocked placement) leaves and
  enters each rack exactly once, so an uplink carries one flow each way, ``2(n-1)/n * M``,
  whatever the oversubscription; the time is that over the slowest hop,
  ``min(nic, uplink)``. Interleaved, every hop of the ring crosses racks.
- hierarchical: intra-rack reduce-scatter (ring of ``W``), ``W`` concurrent cross-rack ring
  allreduces of one ``M/W`` shard each (uplink: ``2(R-1)/R * M``), intra-rack allgather.
- topk gathered: ring allgather of every rank's ``k`` pairs: ``(n-1) * p * k`` per rank.
- topk sharded: alltoall of the ``k`` pairs to shard owners (``(n-1)/n * p * k``), then
  ring allgather of the ``k_down`` downlink pairs (``(n-1)/n * p * k_down``): flat in ``n``.
- dssync: ring allreduce of ``M`` inside each rack (no uplink bytes); every
  ``intra_phases + 1``-th step, rings of one rank per rack instead (``cross_ranks`` rings,
  uplink: ``cross_ranks * 2(R-1)/R * M``); the period's time is spread over its steps.
- decentralized: every step, rank ``j`` sends ``M`` to each rank ``i`` with
  ``W_t[i, j] > 0`` (the mixing matrices of :mod:`hvdx.core.mixing_graphs`, over one
  period of the graph, each step weighted ``1 / (period * mix_every)``). One-peer
  exponential graph: ``M`` to ``i + 2^(t mod tau)``, ``tau = ceil(log2 n)``: one model per
  step each way; static exponential graph: ``M`` to every ``i + 2^j``, ``j < tau``: ``tau``
  models each way. Under blocked placement a hop of distance ``d`` takes
  ``min(d, W)`` flows of each rack across its uplink (all of them once ``d >= W``); under
  interleaved placement a hop crosses racks only if ``R`` does not divide ``d``, so the
  long hops (``2^k >= R``, ``R`` a power of two) stay inside the racks.
  ``order="combine_then_adapt"`` overlaps the exchange with the forward and backward
  pass: its step is ``max(compute, comm)``, the only strategy priced with overlap.
- stanza: the trainer's layout (the last ``F`` ranks are FC workers, each serving a
  contiguous group of conv workers: with two FC workers on 2 x 2 hosts both sit in the
  second rack, so their FC allreduce stays inside it and the first rack's activations
  cross the uplink); ``batch * activation_size * e`` from each conv worker to its FC worker and back,
  then a ring allreduce of the conv parameters among the ``n - F`` conv workers (and of the
  FC parameters among the ``F`` FC workers if ``F > 1``; never on the wire when ``F = 1``).

Not modelled: overlap of communication with backward (a step is compute + comm, an upper
bound; Horovod too overlaps its allreduce with the backward pass in practice, and only
decentralized combine-then-adapt is credited with overlap here), TCP incast losses, TopK
selection time, other jobs' traffic on the uplinks, and host-level hierarchy (NCCL inside
a multi-GPU host; "hierarchical" here is per rack).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from hvdx.core.calibration import Calibration
from hvdx.core.stanza_roles import stanza_roles
from hvdx.core.units import format_rate, parse_quantity, parse_rate, parse_time
from hvdx.core.validation import integer as _integer

__all__ = [
    "Cluster",
    "DEFAULT_STRATEGIES",
    "PLACEMENTS",
    "Phase",
    "Prediction",
    "STRATEGIES",
    "Workload",
    "compare",
    "format_rate",
    "host_order",
    "parse_rate",
    "parse_time",
    "predict",
    "prediction_error",
    "speedup",
    "speedup_over_horovod",
    "topk_pair_bytes",
]

_INDEX_BYTES = 4  # a sparse entry travels as an int32 index next to its value

Number = Union[int, float]

#: How ranks are laid out over the racks (:func:`host_order`).
PLACEMENTS = ("blocked", "interleaved")


def host_order(placement: str, racks: int, hosts_per_rack: int) -> List[int]:
    """The hosts in the order ranks fill them (``ranks_per_host`` each, as MPI does).

    Hosts are numbered rack by rack (host ``h`` is in rack ``h // hosts_per_rack``).

    - ``"blocked"``: ``[0, 1, ..., racks * hosts_per_rack - 1]``: consecutive ranks share
      a rack (a rack-ordered ring crosses each uplink once each way);
    - ``"interleaved"``: one host of each rack in turn, ``[0, H, 2H, ..., 1, H + 1, ...]``
      (``H = hosts_per_rack``): with one rank per host, rank ``r`` is in rack
      ``r mod racks``, so a hop of distance ``d`` crosses racks iff ``racks`` does not
      divide ``d``.

    Raises:
        ValueError: naming ``placement`` if it is not one of :data:`PLACEMENTS`.
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"placement={placement!r} must be one of {', '.join(PLACEMENTS)}")
    racks = _integer("racks", racks, 1)
    hosts_per_rack = _integer("hosts_per_rack", hosts_per_rack, 1)
    slots = range(racks * hosts_per_rack)
    if placement == "blocked":
        return list(slots)
    return [(p % racks) * hosts_per_rack + p // racks for p in slots]


def _positive(name: str, value: object) -> float:
    number = parse_quantity(value, name, {"": 1.0}, "use a positive number")
    if number == 0:
        raise ValueError(f"{name}={value!r} must be a positive number")
    return number


def _fraction(name: str, value: object, low_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and \
        (0 < value <= 1 if low_open else 0 <= value <= 1)
    if not ok:
        raise ValueError(f"{name}={value!r} must be in {'(0' if low_open else '[0'}, 1]")
    return float(value)


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """Racks of hosts behind oversubscribed uplinks.

    Rates may be given as tc strings (``"25gbit"``); they are stored as bits per second.

    Attributes:
        racks: number of racks; racks meet at one non-blocking core switch.
        hosts_per_rack: hosts per rack.
        nic_bps: each host's NIC rate, each way, bits/s.
        uplink_bps: each rack's uplink to the core, each way, bits/s.
        ranks_per_host: ranks (GPUs) per host; they share the host's NIC.
        latency_s: alpha, the start-up cost of one message, seconds.
        intra_host_bps: rate between two ranks of one host; ``None``: not a bottleneck.
        placement: how ranks fill the hosts, one of :data:`PLACEMENTS` (:func:`host_order`).
        calibration: transfer times measured on this cluster
            (:class:`hvdx.core.calibration.Calibration`); with one, every phase is priced
            from them instead of ``alpha + m / beta``, and an allreduce is laid out as the
            MPI library runs it (see :func:`predict`). ``None``: the rates above alone.
    """

    racks: int
    hosts_per_rack: int
    nic_bps: float
    uplink_bps: float
    ranks_per_host: int = 1
    latency_s: float = 25e-6
    intra_host_bps: Optional[float] = None
    placement: str = "blocked"
    calibration: Optional[Calibration] = field(default=None, compare=False)

    def __post_init__(self):
        if self.calibration is not None and not isinstance(self.calibration, Calibration):
            raise ValueError(f"Cluster.calibration={self.calibration!r} must be a "
                             "hvdx.core.calibration.Calibration or None")
        for name in ("racks", "hosts_per_rack", "ranks_per_host"):
            _integer(f"Cluster.{name}", getattr(self, name), 1)
        if self.placement not in PLACEMENTS:
            raise ValueError(f"Cluster.placement={self.placement!r} must be one of "
                             f"{', '.join(PLACEMENTS)}")
        for name in ("nic_bps", "uplink_bps") + (("intra_host_bps",) if
                                                 self.intra_host_bps is not None else ()):
            object.__setattr__(self, name, parse_rate(getattr(self, name), f"Cluster.{name}"))
        object.__setattr__(self, "latency_s", parse_time(self.latency_s, "Cluster.latency_s"))

    @classmethod
    def from_oversubscription(cls, racks: int, hosts_per_rack: int,
                              nic: Union[Number, str], oversubscription: float,
                              **kwargs) -> "Cluster":
        """"8 racks x 32 hosts, 25gbit NICs, 4:1": uplink = hosts * nic / oversubscription."""
        ratio, nic_bps = _positive("oversubscription", oversubscription), parse_rate(nic, "nic")
        hosts = _integer("Cluster.hosts_per_rack", hosts_per_rack, 1)
        return cls(racks=racks, hosts_per_rack=hosts, nic_bps=nic_bps,
                   uplink_bps=hosts * nic_bps / ratio, **kwargs)

    @property
    def ranks(self) -> int:
        """All ranks: racks x hosts per rack x ranks per host."""
        return self.racks * self.ranks_per_rack

    @property
    def ranks_per_rack(self) -> int:
        """Ranks behind one uplink."""
        return self.hosts_per_rack * self.ranks_per_host

    @property
    def host_of_rank(self) -> np.ndarray:
        """The host of every rank (hosts numbered rack by rack), after the placement."""
        order = np.array(host_order(self.placement, self.racks, self.hosts_per_rack))
        return order[np.arange(self.ranks) // self.ranks_per_host]

    @property
    def rack_of_rank(self) -> np.ndarray:
        """The rack of every rank, after the placement."""
        return self.host_of_rank // self.hosts_per_rack

    @property
    def oversubscription(self) -> float:
        """What the rack's NICs could send over what its uplink carries (4.0 means 4:1)."""
        return self.hosts_per_rack * self.nic_bps / self.uplink_bps


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One training step: model size, compute time, and what Stanza moves.

    Attributes:
        conv_params: parameters of the body (conv layers), exchanged by every strategy.
        fc_params: parameters of the head (FC layers), which Stanza keeps on FC workers.
        compute_s: forward + backward + update on one rank, seconds per step.
        bytes_per_element: bytes of one parameter, gradient or activation (4: float32).
        batch_size: samples per rank per step.
        activation_size: elements per sample at the conv/FC boundary (VGG-16: 25,088).
        fc_compute_fraction: share of ``compute_s`` spent in the FC layers (VGG-16: ~0.01).
    """

    conv_params: int
    fc_params: int
    compute_s: float
    bytes_per_element: int = 4
    batch_size: int = 32
    activation_size: int = 0
    fc_compute_fraction: float = 0.0

    def __post_init__(self):
        for name in ("conv_params", "fc_params", "activation_size"):
            _integer(f"Workload.{name}", getattr(self, name), 0)
        for name in ("bytes_per_element", "batch_size"):
            _integer(f"Workload.{name}", getattr(self, name), 1)
        if self.params == 0:
            raise ValueError("Workload.conv_params=0 and fc_params=0: the model is empty")
        object.__setattr__(self, "compute_s", parse_time(self.compute_s, "Workload.compute_s"))
        _fraction("Workload.fc_compute_fraction", self.fc_compute_fraction)

    @classmethod
    def from_total(cls, params: float, fc_fraction: float, compute_s: float,
                   **kwargs) -> "Workload":
        """Splits ``params`` into FC (``fc_fraction``, VGG-16: 0.89) and conv parameters."""
        total = int(round(_positive("params", params)))
        fc = int(round(total * _fraction("fc_fraction", fc_fraction)))
        return cls(conv_params=total - fc, fc_params=fc, compute_s=compute_s, **kwargs)

    @property
    def params(self) -> int:
        """All parameters."""
        return self.conv_params + self.fc_params

    @property
    def model_bytes(self) -> int:
        """Bytes of one dense copy of the gradients (what one allreduce moves)."""
        return self.params * self.bytes_per_element


@dataclass(frozen=True)
class Phase:
    """One communication phase of a step, as the model prices it.

    Attributes:
        name: what moves, e.g. ``"intra-rack group allreduce"``.
        weight: occurrences per step (``1/period`` for phases of a multi-step schedule).
        rounds: latency-bound message rounds (each costs alpha).
        seconds: time of one occurrence: ``rounds * alpha`` + busiest link.
        bottleneck: ``"nic"``, ``"uplink"``, ``"intra-host"``, ``"latency"``, ``"none"``,
            or ``"measured"`` (a calibrated collective timed as a whole).
        nic_bytes: bytes through the busiest host NIC, one way.
        uplink_bytes: bytes through the busiest rack uplink, one way.
        intra_bytes: bytes through the busiest rank's intra-host link, one way.
        sent_bytes: bytes sent per rank, averaged over ranks.
    """

    name: str
    weight: float
    rounds: int
    seconds: float
    bottleneck: str
    nic_bytes: float
    uplink_bytes: float
    intra_bytes: float
    sent_bytes: float


@dataclass(frozen=True)
class Prediction:
    """Predicted cost of one training step of one strategy.

    Attributes:
        strategy: key in :data:`STRATEGIES`; ``label`` adds its options.
        compute_s: compute on the critical path, seconds; or the strategy's measured local
            step (``predict``'s ``local_step_s``), which holds its compute.
        comm_s: communication, seconds (phases weighted per step).
        bytes_per_rank: bytes sent per rank per step, averaged over ranks.
        bottleneck: the link (or latency) that accounts for most of ``comm_s``.
        phases: the priced phases.
        data_ranks: ranks that train on a batch each step (Stanza: conv workers only).
        overlap: communication runs during the compute (decentralized combine-then-adapt).
        hidden_s: communication that runs inside the waits the measured local step
            already holds (``predict``'s ``local_wait_s``), so not added to it again.
    """

    strategy: str
    label: str
    compute_s: float
    comm_s: float
    bytes_per_rank: float
    bottleneck: str
    phases: Tuple[Phase, ...]
    data_ranks: int
    overlap: bool = False
    hidden_s: float = 0.0

    @property
    def step_s(self) -> float:
        """compute + communication, less what of it is hidden in the local step's waits;
        ``max`` of the two where they overlap."""
        if self.overlap:
            return max(self.compute_s, self.comm_s)
        return self.compute_s + self.comm_s - self.hidden_s

    @property
    def seconds_per_batch(self) -> float:
        """Step time per batch trained: fair across strategies with fewer data ranks."""
        return self.step_s / self.data_ranks


# --- flows and their price -----------------------------------------------------------

Flow = Tuple[np.ndarray, np.ndarray, float]  # (src ranks, dst ranks, bytes of each flow)


class _Traffic(NamedTuple):
    name: str
    flows: List[Flow]
    rounds: int
    weight: float = 1.0
    #: True: the same flows repeat in each of the ``rounds`` (a ring), each carrying
    #: ``1/rounds`` of its bytes per round; False: every flow is sent once, all at once
    #: (an alltoall), and ``rounds`` counts start-ups only.
    repeated: bool = True
    #: Seconds measured for this very collective (a calibrated allreduce); the flows
    #: then only count its bytes.
    measured_s: Optional[float] = None
    #: hvdx's own exchange (:mod:`hvdx.mpi.neighbor_exchange`), which posts its sends
    #: before its receives: two ranks that send to each other move their data as a
    #: shift does (5.4 MB each way, two pairs through a 20 Mbit uplink: 4.6-5.4 s,
    #: where the calibrated shift gives 4.8), not as the swaps of MPI's collectives,
    #: which post receives first and then often run one direction after the other.
    sends_first: bool = False


class _Plan(NamedTuple):
    label: str
    traffic: List[_Traffic]
    compute_s: Optional[float] = None
    data_ranks: Optional[int] = None
    overlap: bool = False


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


def _link_flows(flows: List[Flow], c: Cluster) -> Dict[str, List[Tuple[int, float, bool]]]:
    """Per link class, every loaded link in each direction as ``(flows, bytes, oneway)``,
    ``oneway`` when nothing goes through that link the other way.

    A flow loads its hosts' NICs when it leaves its host, its racks' uplinks when it leaves
    its rack, and the two ranks' intra-host ports when it stays on one host.
    """
    sizes = {"nic": c.racks * c.hosts_per_rack, "uplink": c.racks, "intra-host": c.ranks}
    counts = {link: np.zeros((2, size)) for link, size in sizes.items()}
    loads = {link: np.zeros((2, size)) for link, size in sizes.items()}
    host, rack = c.host_of_rank, c.rack_of_rank
    for src, dst, nbytes in flows:
        host_s, host_d = host[src], host[dst]
        rack_s, rack_d = rack[src], rack[dst]
        for link, a, b, mask in (("nic", host_s, host_d, host_s != host_d),
                                 ("uplink", rack_s, rack_d, rack_s != rack_d),
                                 ("intra-host", src, dst, (host_s == host_d) & (src != dst))):
            for side, ends in ((0, a), (1, b)):
                leaving = np.bincount(ends[mask], minlength=sizes[link])
                counts[link][side] += leaving
                loads[link][side] += leaving * nbytes
    # Row 0 of a link is its traffic out, row 1 its traffic in: the other way is row 1 - side.
    return {link: [(int(counts[link][side, i]), float(loads[link][side, i]),
                    not counts[link][1 - side, i])
                   for side in (0, 1) for i in range(sizes[link]) if counts[link][side, i]]
            for link in sizes}


def _link_loads(flows: List[Flow], c: Cluster) -> Dict[str, float]:
    """Bytes through the busiest NIC, uplink and intra-host port, in its busier direction
    (:func:`_link_flows`)."""
    return {link: max((nbytes for _, nbytes, _ in loaded), default=0.0)
            for link, loaded in _link_flows(flows, c).items()}


def _price_calibrated(traffic: _Traffic, c: Cluster) -> Tuple[float, str]:
    """Seconds of one occurrence of ``traffic`` from the cluster's calibration, and the
    link class that took longest.

    1. per link and direction, the flows through it and their bytes;
    2. a repeated traffic (a ring) is ``rounds`` rounds of ``1/rounds`` of those bytes,
       each priced by :meth:`Calibration.round_s` for that many flows: from the timed
       one-way rounds on a link that nothing crosses the other way, from the timed
       swaps if every flow is answered by one the other way (unless hvdx's own
       exchange, which posts sends first, sends them), else from the timed shifts; a
       traffic sent all at once is one round;
    3. the busiest link sets the time; a class the calibration lacks is priced by the
       rates and alpha (``intra-host`` without a rate: free).
    """
    cal = c.calibration
    rates = {"nic": c.nic_bps, "uplink": c.uplink_bps, "intra-host": c.intra_host_bps}
    best, where = 0.0, "none"
    rounds = traffic.rounds if traffic.repeated else 1
    # Ranks that swap messages in pairs, or a shift (sent to one rank, received from
    # another): the calibration timed both (hvdx.core.calibration, step 4).
    edges = {(int(a), int(b)) for src, dst, _ in traffic.flows for a, b in zip(src, dst)}
    shift = traffic.sends_first or any((b, a) not in edges for a, b in edges)
    for link, loaded in _link_flows(traffic.flows, c).items():
        for flows, nbytes, oneway in loaded:
            if cal.has(link):
                seconds = rounds * cal.round_s(link, flows, nbytes / flows / rounds, shift,
                                               oneway)
            elif rates[link]:
                seconds = traffic.rounds * c.latency_s + 8 * nbytes / rates[link]
            else:
                seconds = 0.0
            if seconds > best:
                best, where = seconds, link
    return best, where


def _price(traffic: _Traffic, c: Cluster) -> Phase:
    """1. load every link with the flows; 2. busiest link / its rate; 3. add rounds * alpha.

    With a calibration, 2 and 3 are :func:`_price_calibrated`.
    """
    loads = _link_loads(traffic.flows, c)
    sent = sum(len(src) * nbytes for src, _, nbytes in traffic.flows) / c.ranks
    if traffic.measured_s is not None:
        return Phase(traffic.name, traffic.weight, traffic.rounds, traffic.measured_s,
                     "measured", loads["nic"], loads["uplink"], loads["intra-host"], sent)
    if c.calibration is not None:
        seconds, link = _price_calibrated(traffic, c)
        return Phase(traffic.name, traffic.weight, traffic.rounds, seconds, link,
                     loads["nic"], loads["uplink"], loads["intra-host"], sent)
    rates = {"nic": c.nic_bps, "uplink": c.uplink_bps, "intra-host": c.intra_host_bps}
    times = {link: 8 * load / rates[link] if rates[link] else 0.0
             for link, load in loads.items()}
    link = max(times, key=times.get)
    latency = traffic.rounds * c.latency_s if traffic.flows else 0.0
    bottleneck = "latency" if latency > times[link] else link if times[link] > 0 else "none"
    return Phase(traffic.name, traffic.weight, traffic.rounds, latency + times[link],
                 bottleneck, loads["nic"], loads["uplink"], loads["intra-host"], sent)


# --- strategies ----------------------------------------------------------------------

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


def _set_averages(name: str, groups: np.ndarray, nbytes: float, c: Cluster,
                  weight: float) -> List[_Traffic]:
    """DS-Sync's average of ``nbytes`` on the process sets of ``groups`` (every row at
    once): as the calibration timed that very op through Horovod where it did
    (:class:`~hvdx.core.calibration.Calibration` step 8: the negotiation and the
    background cycles are in the time), else MPI's allreduce (:func:`_allreduces`)
    plus the small collectives Horovod adds for an op on process sets
    (:func:`_set_negotiation`)."""
    cal, kind = c.calibration, _group_kind(groups, c)
    measured = cal.set_allreduce_s(kind, nbytes) \
        if cal is not None and kind is not None and groups.shape[1] > 1 else None
    if measured is not None:
        return [_as_measured(_allreduce(name + " through Horovod", groups, nbytes, weight),
                             measured)]
    return [t._replace(weight=weight) for t in _set_negotiation(groups, c)] + \
        _allreduces(name, groups, nbytes, c, weight)


def _horovod(c: Cluster, w: Workload) -> _Plan:
    """Horovod's flat ring allreduce over all ranks (Patarasuk & Yuan 2009)."""
    everyone = np.arange(c.ranks)[None, :]
    return _Plan("horovod", _negotiation(everyone, c) +
                 _allreduces("ring allreduce", everyone, w.model_bytes, c))


def _hierarchical(c: Cluster, w: Workload) -> _Plan:
    """Two-level allreduce (Thakur et al. 2005; Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE).

    1. ring reduce-scatter inside each rack: rank j of a rack ends with shard j summed;
    2. ring allreduce of shard j among the j-th ranks of all racks (W rings at once);
    3. ring allgather inside each rack.
    """
    grid, width = _grid(c), c.ranks_per_rack
    half = (width - 1) / width * w.model_bytes  # one ring pass: reduce-scatter or allgather
    return _Plan("hierarchical", [
        _Traffic("intra-rack reduce-scatter", _rings(grid, half), width - 1),
        _allreduce("cross-rack allreduce of shards", grid.T, w.model_bytes / width),
        _Traffic("intra-rack allgather", _rings(grid, half), width - 1)])


def topk_pair_bytes(params: int, ratio: float, downlink_ratio: Optional[float] = None,
                    bytes_per_element: int = 4) -> Tuple[int, int]:
    """``(uplink, downlink)`` bytes of the (index, value) pairs one rank's TopK selects
    from ``params`` parameters: ``ceil(ratio * params)`` pairs up, ``ceil(downlink_ratio *
    params)`` down (``downlink_ratio`` defaults to ``ratio``), each an int32 index next
    to its value. What the cost model prices, and what ``hvdx bench`` times sharded
    TopK's step at around its runs."""
    ratio = _fraction("ratio", ratio, low_open=True)
    down = _fraction("downlink_ratio", ratio if downlink_ratio is None else downlink_ratio,
                     low_open=True)
    pair = _INDEX_BYTES + bytes_per_element
    return math.ceil(ratio * params) * pair, math.ceil(down * params) * pair


def _topk(c: Cluster, w: Workload, ratio: float = 0.01, downlink_ratio: Optional[float] = None,
          mode: str = "gathered") -> _Plan:
    """TopK sparsification (Zou, De Sterck & Liu, arXiv 2209.15203).

    gathered: 1. every rank allgathers its k (index, value) pairs; every rank sums them
    (and applies its downlink TopK locally, which costs no bytes).
    sharded: 1. alltoall: the pairs of shard s go to rank s; 2. rank s sums its shard and
    keeps the top ``k_down / n``; 3. allgather of those downlink shards.
    A calibration that timed hvdx's allgather and alltoall prices them as timed; one that
    timed sharded TopK's two collectives one after the other, as its step runs them
    (:class:`~hvdx.core.calibration.Calibration` step 9), prices 1 and 3 together so.
    """
    if mode not in ("gathered", "sharded"):
        raise ValueError(f"mode={mode!r} must be 'gathered' or 'sharded'")
    n = c.ranks
    k_up, k_down = topk_pair_bytes(w.params, ratio, downlink_ratio, w.bytes_per_element)
    # hvdx's collectives as the calibration timed them (hvdx.core.calibration, step 7);
    # one rank has nothing to send.
    cal = c.calibration if n > 1 else None

    if mode == "gathered":
        # Ring allgather: each rank forwards the other n-1 ranks' k pairs.
        gather = _rings(np.arange(n)[None, :], (n - 1) * k_up)
        return _Plan(f"topk gathered {ratio:g}", [_as_measured(
            _Traffic("allgather of top-k pairs", gather, n - 1),
            cal and cal.allgather_s(k_up))])
    down = ratio if downlink_ratio is None else downlink_ratio
    # Indices spread evenly over the n shards: each owner gets k_up/n pairs from each rank.
    scatter = [_shift(n, d, k_up / n) for d in range(1, n)]
    gather = _rings(np.arange(n)[None, :], (n - 1) / n * k_down)
    both = cal and cal.sharded_topk_s(k_up, k_down / k_up)
    if both is not None:
        return _Plan(f"topk sharded {ratio:g}/{down:g}", [_as_measured(
            _Traffic("alltoall of top-k pairs to shard owners, then allgather of the "
                     "downlink shards", scatter + gather, 2 * (n - 1), repeated=False),
            both)])
    return _Plan(f"topk sharded {ratio:g}/{down:g}", [
        _as_measured(_Traffic("alltoall of top-k pairs to shard owners", scatter, n - 1,
                              repeated=False), cal and cal.alltoall_s(k_up)),
        _as_measured(_Traffic("allgather of downlink top-k shards", gather, n - 1),
                     cal and cal.allgather_s(k_down / n))])


def _dssync(c: Cluster, w: Workload, intra_phases: int = 1,
            cross_ranks: Optional[int] = None) -> _Plan:
    """DS-Sync group averaging (Wang et al., arXiv 2007.03298), rotation schedule.

    1. ``intra_phases`` steps: every rack averages the full model in a ring of W ranks;
    2. one step: groups of one rank per rack average it (``cross_ranks`` groups at once);
    3. each step's average is an op on Horovod process sets, negotiated in the set and
       in every background cycle over all ranks (:func:`_set_averages`);
    4. the period's time is spread evenly over its steps.
    """
    grid, width = _grid(c), c.ranks_per_rack
    intra_phases = _integer("intra_phases", intra_phases, 0)
    cross = width if cross_ranks is None else _integer("cross_ranks", cross_ranks, 1, width)
    # With one rack every phase is intra-rack; with one rank per rack every phase crosses.
    intra = (intra_phases if c.racks > 1 else 1) if width > 1 else 0
    crossing = 1 if c.racks > 1 else 0
    period = max(intra + crossing, 1)
    # Crossing ranks are spread over hosts (first local rank of each host, then second).
    order = sorted(range(width), key=lambda j: (j % c.ranks_per_host, j // c.ranks_per_host))
    crossing_groups = grid[:, order[:cross]].T
    traffic = _set_averages("intra-rack group allreduce", grid, w.model_bytes, c,
                            intra / period) + \
        _set_averages("cross-rack group allreduce", crossing_groups, w.model_bytes, c,
                      crossing / period)
    return _Plan(f"dssync intra={intra_phases} cross={cross}", [t for t in traffic if t.weight > 0])


#: The graphs :func:`_decentralized` prices (those of ``hvdx.Decentralized``).
DECENTRALIZED_TOPOLOGIES = ("one-peer-exp", "static-exp", "one-peer-hypercube", "ring",
                            "torus", "complete")
_ORDERS = ("adapt_then_combine", "combine_then_adapt")


def _graph_step_flows(topology: str, n: int, step: int, nbytes: float) -> Tuple[List[Flow], str]:
    """Mix ``step``'s flows: rank ``j`` sends ``nbytes`` to every ``i`` with
    ``W[i, j] > 0``, ``i != j``; and a name (the shifts, for a circulant graph)."""
    from hvdx.core import mixing_graphs

    w = np.asarray(mixing_graphs.mixing_matrix(topology, n, step))
    dst, src = np.nonzero((w != 0) & ~np.eye(n, dtype=bool))
    if len(src) == 0:
        return [], "no exchange"
    shifts = (dst - src) % n
    per_rank = [tuple(sorted(shifts[src == r])) for r in range(n)]
    if all(p == per_rank[0] for p in per_rank):  # every rank sends to i + the same shifts
        peers = per_rank[0]
        name = "send model to " + ", ".join(f"i+{d}" if d <= n // 2 else f"i-{n - d}"
                                            for d in peers)
        if len(peers) > 4:
            name = f"send model to {len(peers)} peers"
    else:
        name = f"step {step}: send model to {len(src) / n:g} peers on average"
    return [(src, dst, nbytes)], name


def _decentralized(c: Cluster, w: Workload, topology: str = "one-peer-exp",
                   order: str = "adapt_then_combine", mix_every: int = 1) -> _Plan:
    """Decentralized SGD over a graph (Ying et al., "Exponential Graph is Provably
    Efficient for Decentralized Deep Training", NeurIPS 2021), as ``hvdx.Decentralized``.

    1. for each mix ``m`` of the graph's period, every rank sends its model to its
       out-neighbours at once (non-blocking point-to-point, one message each);
    2. the mix's phase is weighted ``1 / (period * mix_every)``: the graph follows the
       mixes, not the steps (:func:`hvdx.core.mixing_graphs.mix_index`), so every
       ``period * mix_every`` training steps hold each of the ``period`` mixes once,
       and local steps in between with ``mix_every > 1``;
    3. combine-then-adapt overlaps the exchange with the next forward and backward pass.
    """
    from hvdx.core import mixing_graphs

    if topology not in DECENTRALIZED_TOPOLOGIES:
        raise ValueError(f"topology={topology!r} must be one of "
                         f"{', '.join(DECENTRALIZED_TOPOLOGIES)}")
    if order not in _ORDERS:
        raise ValueError(f"order={order!r} must be one of {', '.join(_ORDERS)}")
    mix_every = _integer("mix_every", mix_every, 1)
    n = c.ranks
    label = f"decentralized {topology}" + (" cta" if order == _ORDERS[1] else "") + \
        (f" every {mix_every}" if mix_every > 1 else "")
    if n == 1:
        return _Plan(label, [])
    period = mixing_graphs.period(topology, n)
    traffic = []
    for step in range(period):
        flows, name = _graph_step_flows(topology, n, step, w.model_bytes)
        if flows:
            traffic.append(_Traffic(name, flows, 1, 1 / (period * mix_every),
                                    sends_first=True))
    return _Plan(label, traffic, overlap=order == _ORDERS[1])


def _stanza_roles(c: Cluster, fc_workers: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The trainer's own layout (:func:`hvdx.core.stanza_roles.stanza_roles`): the last
    ``F`` ranks are FC workers, each serving a contiguous group of conv workers. Returns
    (conv ranks, their FC worker, FC ranks)."""
    roles = stanza_roles(c.ranks, fc_workers)
    target = [fc for fc, group in zip(roles.fc_ranks, roles.groups) for _ in group]
    return (np.array(roles.conv_ranks, dtype=int), np.array(target, dtype=int),
            np.array(roles.fc_ranks, dtype=int))


def _stanza(c: Cluster, w: Workload, fc_workers: int = 1) -> _Plan:
    """Stanza layer separation (Wu et al., IEEE TSC 2020).

    1. conv workers send their batch's activations to their FC worker;
    2. FC workers run the head and send the activation gradients back;
    3. conv workers allreduce the conv gradients (FC workers the FC ones, if F > 1).
    """
    # From 1 to ranks // 2, as the trainer allows (stanza_roles names the value if not).
    fc_workers = _integer("fc_workers", fc_workers, 1, max(1, c.ranks // 2))
    conv, target, fc = _stanza_roles(c, fc_workers)
    activations = w.batch_size * w.activation_size * w.bytes_per_element
    # Conv and FC rings run at once on disjoint ranks; F = 1 gives no FC ring at all.
    conv_ring = _allreduces("", conv[None, :], w.conv_params * w.bytes_per_element, c)
    fc_ring = _allreduces("", fc[None, :], w.fc_params * w.bytes_per_element, c)
    # The busiest FC worker runs the head for all of its conv workers, one after another.
    most_fed = int(np.bincount(target).max())
    compute = w.compute_s * ((1 - w.fc_compute_fraction) + most_fed * w.fc_compute_fraction)
    traffic = [
        _Traffic("activations to FC workers", [(conv, target, activations)], 1),
        _Traffic("activation gradients to conv workers", [(target, conv, activations)], 1),
        *_at_once("conv allreduce (and FC allreduce if F > 1)", conv_ring, fc_ring)]
    return _Plan(f"stanza F={fc_workers}", traffic, compute_s=compute, data_ranks=len(conv))


#: Strategy keys and the function that lays out their traffic.
STRATEGIES = {"horovod": _horovod, "hierarchical": _hierarchical, "topk": _topk,
              "dssync": _dssync, "decentralized": _decentralized, "stanza": _stanza}

#: What :func:`compare` prices by default: every strategy, both TopK modes, and the
#: exponential graphs (static, one-peer, and one-peer overlapped with the compute).
DEFAULT_STRATEGIES = ("horovod", "hierarchical", ("topk", {"mode": "gathered"}),
                      ("topk", {"mode": "sharded"}), "dssync",
                      ("decentralized", {"topology": "static-exp"}),
                      ("decentralized", {"topology": "one-peer-exp"}),
                      ("decentralized", {"topology": "one-peer-exp",
                                         "order": "combine_then_adapt"}), "stanza")


def _options_of(strategy: str) -> Tuple[str, ...]:
    return tuple(inspect.signature(STRATEGIES[strategy]).parameters)[2:]


def predict(strategy: str, cluster: Cluster, workload: Workload,
            local_step_s: Optional[float] = None, local_wait_s: Optional[float] = None,
            local_cores: Optional[int] = None, **options) -> Prediction:
    """Predicts one step of ``strategy`` on ``cluster``.

    Args:
        strategy: a key of :data:`STRATEGIES`.
        cluster: the network.
        workload: the model and its compute time.
        local_step_s: this strategy's step measured with every rank on one host, talking
            through shared memory (``hvdx bench`` measures it before its cluster runs).
            It replaces the modelled compute: it holds the compute, the strategy's own
            CPU work (TopK's selection and sums, Stanza's head for every conv worker),
            and what each of its collectives costs on these cores apart from the wire
            (the ranks' waits on each other), none of which the phases price; shared
            memory's own transfer time is small next to a cluster's (8 MiB: under 1 ms),
            so the phases are added whole. ``None``: the workload's compute.
        local_wait_s: of ``local_step_s``, the time per step that the rank waiting
            least spent in hvdx's own MPI waits (:func:`hvdx.mpi.sparse.waited_s`).
            With more ranks than cores the ranks reach each exchange in waves, one
            wave per ``local_cores`` ranks, and the earlier waves wait there while the
            last one computes (four ranks on two cores: every rank waited 25-50 ms of
            a TopK step). On the cluster the earlier waves' messages cross the wire
            during that wait; only the last wave's share, ``local_cores / ranks`` of
            the wire, surely comes after it. So the step is ``local_step_s + comm -
            min(local_wait_s, comm * (1 - local_cores / ranks))``
            (:attr:`Prediction.hidden_s`): on a flat cluster with 14 ms of priced
            wire, topk_dgc's cluster step was its local step (87 and 86 ms; 88 and 88
            ms), and topk_masked's, with 21 ms, 21 and 8 ms longer than its local step
            in two runs; hiding the whole wire put it 20% low, hiding none 16%
            high for topk_dgc. Needs ``local_step_s`` and ``local_cores``; not used
            where communication overlaps the compute (already ``max``).
        local_cores: the cores the local run's ranks shared (``hvdx bench``: this
            machine's); none hidden with at least one core per rank.
        **options: the strategy's options: topk ``ratio``, ``downlink_ratio``, ``mode``;
            dssync ``intra_phases``, ``cross_ranks``; decentralized ``topology``,
            ``order``, ``mix_every``; stanza ``fc_workers``.

    Raises:
        ValueError: for an unknown strategy, an option it does not take, or a bad value.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not one of {', '.join(STRATEGIES)}")
    unknown = sorted(set(options) - set(_options_of(strategy)))
    if unknown:
        raise ValueError(f"strategy {strategy!r} takes no option {', '.join(unknown)}; it "
                         f"takes: {', '.join(_options_of(strategy)) or 'none'}")
    if local_step_s is not None:
        local_step_s = parse_time(local_step_s, "local_step_s")
    if local_wait_s is not None:
        if local_step_s is None:
            raise ValueError(f"local_wait_s={local_wait_s!r} needs local_step_s: it is "
                             "the part of a measured local step spent waiting")
        local_wait_s = parse_time(local_wait_s, "local_wait_s")
        if local_wait_s > local_step_s:
            raise ValueError(f"local_wait_s={local_wait_s!r} is longer than "
                             f"local_step_s={local_step_s!r}, which holds it")
        if isinstance(local_cores, bool) or not isinstance(local_cores, int) or \
                local_cores < 1:
            raise ValueError(f"local_cores={local_cores!r} must be the number of cores "
                             "the local run's ranks shared (a whole number, at least 1), "
                             "given with local_wait_s")
    plan = STRATEGIES[strategy](cluster, workload, **options)
    phases = tuple(_price(t, cluster) for t in plan.traffic)
    per_link: Dict[str, float] = {}
    for p in phases:
        per_link[p.bottleneck] = per_link.get(p.bottleneck, 0.0) + p.weight * p.seconds
    comm = sum(per_link.values())
    compute = workload.compute_s if plan.compute_s is None else plan.compute_s
    hidden = 0.0
    if local_wait_s is not None and not plan.overlap:
        # The earlier waves' share of the wire, as far as the wait holds it.
        hidden = min(local_wait_s, comm * max(0.0, 1.0 - local_cores / cluster.ranks))
    return Prediction(
        strategy, plan.label, compute if local_step_s is None else local_step_s, comm,
        sum(p.weight * p.sent_bytes for p in phases),
        max(per_link, key=per_link.get) if comm > 0 else "none", phases,
        cluster.ranks if plan.data_ranks is None else plan.data_ranks, plan.overlap,
        hidden)


def compare(cluster: Cluster, workload: Workload,
            strategies: Sequence[Union[str, Tuple[str, Mapping]]] = DEFAULT_STRATEGIES,
            local_steps: Optional[Mapping[str, float]] = None,
            local_waits: Optional[Mapping[str, float]] = None,
            local_cores: Optional[int] = None, **options) -> List[Prediction]:
    """Predicts several strategies, fastest first (by time per batch trained).

    Args:
        strategies: keys, or ``(key, options)`` pairs whose options win over ``options``.
        local_steps: strategy key -> its measured local step (:func:`predict`'s
            ``local_step_s``), for every entry of that key; keys not given: none.
        local_waits: strategy key -> the wait in hvdx's exchanges that its local step
            holds (:func:`predict`'s ``local_wait_s``); keys not given: none.
        local_cores: the cores the local runs' ranks shared (:func:`predict`'s).
        **options: shared options; each strategy takes those it knows.

    Raises:
        ValueError: for an unknown strategy, here, in ``local_steps`` or in
            ``local_waits``, or a wait without a local step.
    """
    local_steps, local_waits = dict(local_steps or {}), dict(local_waits or {})
    for what, given in (("local_steps", local_steps), ("local_waits", local_waits)):
        for name in given:
            if name not in STRATEGIES:
                raise ValueError(f"{what} has strategy {name!r}, not one of "
                                 f"{', '.join(STRATEGIES)}")
    predictions = []
    for entry in strategies:
        name, own = (entry, {}) if isinstance(entry, str) else entry
        if name not in STRATEGIES:
            raise ValueError(f"strategy={name!r} is not one of {', '.join(STRATEGIES)}")
        merged = {k: v for k, v in options.items() if k in _options_of(name)}
        predictions.append(predict(name, cluster, workload, local_steps.get(name),
                                   local_waits.get(name), local_cores,
                                   **{**merged, **own}))
    return sorted(predictions, key=lambda p: p.seconds_per_batch)


def speedup(prediction: Prediction, baseline: Prediction) -> float:
    """How many times faster ``prediction`` trains a batch than ``baseline``."""
    return baseline.seconds_per_batch / prediction.seconds_per_batch


def speedup_over_horovod(prediction: Prediction, cluster: Cluster, workload: Workload) -> float:
    """:func:`speedup` against Horovod's flat ring on the same cluster and workload."""
    return speedup(prediction, predict("horovod", cluster, workload))


def prediction_error(predicted: Union[Prediction, float], measured: float) -> float:
    """Relative error ``(predicted - measured) / measured``; positive: the model is slow.

    Raises:
        ValueError: if ``measured`` is not a positive number of seconds.
    """
    if isinstance(measured, bool) or not isinstance(measured, (int, float)) or \
            not 0 < measured < math.inf:
        raise ValueError(f"measured={measured!r} must be a positive step time in seconds")
    value = predicted.step_s if isinstance(predicted, Prediction) else float(predicted)
    return (value - measured) / measured
