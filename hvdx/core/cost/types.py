"""What the cost model describes and returns: the cluster, the workload, the flows of a
phase, a strategy's plan, and the priced phases and prediction (:mod:`hvdx.core.cost_model`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional, Tuple, Union

import numpy as np

from hvdx.core.calibration import Calibration
from hvdx.core.units import parse_quantity, parse_rate, parse_time
from hvdx.core.validation import check_integer

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
    racks = check_integer("racks", racks, 1)
    hosts_per_rack = check_integer("hosts_per_rack", hosts_per_rack, 1)
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
            check_integer(f"Cluster.{name}", getattr(self, name), 1)
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
        hosts = check_integer("Cluster.hosts_per_rack", hosts_per_rack, 1)
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
            check_integer(f"Workload.{name}", getattr(self, name), 0)
        for name in ("bytes_per_element", "batch_size"):
            check_integer(f"Workload.{name}", getattr(self, name), 1)
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
    #: hvdx's own exchange
    #: (:mod:`hvdx.mpi.neighbor_exchange`), which posts its
    #: sends before its receives: two ranks that send to each other move their data as a
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
